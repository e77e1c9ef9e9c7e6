"""Fixtures of tests/train (defined in train_support.py, which the tests also import helpers from)."""

from train_support import *  # noqa: F401,F403
from train_support import _one_thread, _one_thread_for_module_fixtures  # noqa: F401  (autouse fixtures)
