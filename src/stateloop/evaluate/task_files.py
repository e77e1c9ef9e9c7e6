"""[shim] Moved to :mod:`stateloop.evaluate.tasks.files`; kept until rehearse/run.py,
tests/conftest.py and tests/workflow/rehearsal_support.py import from there."""

from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR, REPO, default_shared_data, task_yamls

__all__ = ["DEFAULT_TASK_DIR", "REPO", "default_shared_data", "task_yamls"]
