"""The console script ``stateloop``: a command started from a shell in a local DAG runs in a child of
the DAG's warm server where there is one (stateloop/ops/warm.py), any other in this process. The
commands, their parser and their running are stateloop/commands/.
"""

from __future__ import annotations

import sys

from stateloop.ops.warm import delegate


def main(argv: list[str] | None = None) -> int:
    """Run ``stateloop ARGV`` (``sys.argv[1:]`` when None). A command started from a shell in a
    local DAG runs in a child of the DAG's warm server where there is one (stateloop/ops/warm.py)."""
    if argv is None:
        code = delegate()
        if code is not None:
            return code
    from stateloop.commands import run_command  # lazy: after delegating, a served command's process imports little

    return run_command(argv)


if __name__ == "__main__":
    sys.exit(main())
