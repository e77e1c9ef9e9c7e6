"""``stateloop schema``: the JSON Schema of pipeline configs, generated from the config declarations
(workflow/schemas/config.schema.yaml is this output), and with ``--docs`` the reference of every
config key (configs/README.md); stateloop/config/schema.py renders both."""

from __future__ import annotations

from stateloop.config import StageRequest, Text, arg
from stateloop.config.schema import render, render_docs
from stateloop.files import atomic_write_bytes

DOCS_FILE = "configs/README.md"


class Request(StageRequest):
    out: Text | None = arg("write the schema here (default: stdout)", None)
    docs: Text | None = arg(f"also write the reference of every config key here ({DOCS_FILE})", None, metavar="PATH")


def run(args: Request) -> int:
    text = render()
    if args.out:
        atomic_write_bytes(args.out, text.encode())
    else:
        print(text, end="")
    if args.docs:
        atomic_write_bytes(args.docs, render_docs().encode())
    return 0
