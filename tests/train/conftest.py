"""Fixtures of tests/train (defined in train_support.py, which the tests also import helpers from)."""

from train_support import *  # noqa: F401,F403
from train_support import _one_thread  # noqa: F401  (autouse fixture)
