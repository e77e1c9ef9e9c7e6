"""[shim] Moved to :mod:`stateloop.evaluate.tasks.rehearsal`; kept until rehearse/run.py imports
``write_tasks`` from there."""

from stateloop.evaluate.tasks.rehearsal import write_tasks

__all__ = ["write_tasks"]
