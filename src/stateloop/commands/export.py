"""``stateloop export RUN --out DIR``: a trained run as a Hugging Face model directory.

DIR (replaced whole, atomically; never the run folder or its data folder, nor a folder holding
or inside either: refused in one line) then loads with transformers alone::

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    AutoTokenizer.from_pretrained(DIR)

and is scored by stock lm-eval (``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``).
What the directory holds and why: stateloop/export/hf.py.

A SIGTERM or SIGHUP (``scancel``, a closed terminal) stops it as Ctrl-C does: its temporary folder
(``.DIR.XXXXXXXX.tmp`` beside DIR) is removed, DIR is left as it was, one line says so, and the
exit status is 128 + the signal's number. What a killed export left the next export to DIR removes.
A failed write (a full disk) is one line naming DIR, exit 74.
"""

from __future__ import annotations

import signal
import sys
import threading

from stateloop.config import StageRequest, Text, arg
from stateloop.export.hf import export_run
from stateloop.run_ids import RUN_HELP
from stateloop.runs import resolve_run_arg


class Request(StageRequest):
    run: Text = arg(RUN_HELP, positional=True, metavar="RUN")
    out: Text = arg("the Hugging Face directory to write (replaced if it exists; outside the run and data folders)", metavar="DIR")


class Stopped(BaseException):
    """A signal that ends the export (raised in the main thread by its handler, so the export's
    cleanup runs as for Ctrl-C)."""


STOP_SIGNALS = ("SIGTERM", "SIGHUP")


def _stop(signum, _frame):
    raise Stopped(signum)


def run(args: Request) -> int:
    previous = {}
    if threading.current_thread() is threading.main_thread():  # handlers can be set there only
        previous = {sig: signal.signal(sig, _stop) for sig in (getattr(signal, n) for n in STOP_SIGNALS if hasattr(signal, n))}
    try:
        out = export_run(resolve_run_arg(args.run).folder, args.out,
                         log=lambda msg: print(f"stateloop export: {msg}", file=sys.stderr))
    except Stopped as stop:
        signum = stop.args[0]
        print(f"stateloop export: stopped by {signal.Signals(signum).name}; its temporary folder is removed and "
              f"{args.out} holds no partial export", file=sys.stderr)
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"wrote {out}", file=sys.stderr)
    return 0
