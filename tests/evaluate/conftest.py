"""Fixtures of tests/evaluate (defined in support/evaluation.py, which the tests also import helpers from)."""

from support.evaluation import *  # noqa: F401,F403
from support.evaluation import _offline  # noqa: F401  (autouse fixture)
from support.threads import _one_thread  # noqa: F401  (autouse fixture)
