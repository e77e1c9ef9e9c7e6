"""Fixtures of tests/train (defined in support/training.py, which the tests also import helpers from)."""

from support.threads import _one_thread, _one_thread_for_module_fixtures  # noqa: F401  (autouse fixtures)
from support.training import *  # noqa: F401,F403
