"""Fixtures of tests/evaluate (defined in evaluate_support.py, which the tests also import helpers from)."""

from evaluate_support import *  # noqa: F401,F403
from evaluate_support import _offline, _one_thread  # noqa: F401  (autouse fixtures)
