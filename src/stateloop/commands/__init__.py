"""``stateloop <command>``: every pipeline stage as one command; Snakemake rules only wire them.

One module per command, named in :data:`COMMANDS`, provides its typed ``Request`` (config.StageRequest:
a stage's own, or the command's) and ``run(request) -> int``. Each flag is declared once, as a field
of the request (config.arg): :func:`add_flags` builds the parser from the fields (one per subcommand
of ``SUBCOMMANDS``; lm-eval's arguments: ``add_arguments(parser)``), and the parsed flags are the
request (``Request.of(args)``); a module's ``EPILOG`` ends its ``--help`` (plan: its exit statuses).
A command's module and request are imported to build its parser, so heavy dependencies (torch,
lightning, lm-eval, mlflow) are imported inside ``run`` only.

:func:`run_command` parses a command line and runs its command in this process. The console script
(stateloop/cli.py) first offers the command to a local DAG's warm server (stateloop/ops/warm.py), whose
children call :func:`run_command` in turn.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import typing

from stateloop.config import ConfigError, flag_of, kinds_of

# command -> (module, one-line help): the pipeline's stages in the order the DAG runs them
# (workflow/rules/*.smk: tokens -> runs -> evaluations -> analyses -> timings -> tables and
# figures -> exports), then the tools around it. `stateloop --help` lists them in this order.
PIPELINE: dict[str, tuple[str, str]] = {
    "tokenize": ("stateloop.commands.tokenize", "text (synthetic, local files or a hub dataset) -> token shards"),
    "train": ("stateloop.commands.train", "train one run with Lightning Fabric (resumes from its checkpoints)"),
    "eval": ("stateloop.commands.eval", "held-out perplexity and lm-eval tasks (0/5-shot) of a trained run"),
    "analyze": ("stateloop.commands.analyze", "analyses of a trained run: Shapley values of state reads, replacement/freezing"),
    "bench": ("stateloop.commands.bench", "benchmarks: decode (per-token latency, Table 3)"),
    "render": ("stateloop.commands.render", "one table (CSV + Markdown) or figure (PDF + PNG) from the results"),
    "export": ("stateloop.commands.export", "a trained run as a Hugging Face model directory (transformers, stock lm-eval)"),
}
TOOLS: dict[str, tuple[str, str]] = {
    "prefetch": ("stateloop.commands.prefetch", "fetch what a config's jobs read from the Hugging Face Hub, for offline jobs"),
    "params": ("stateloop.commands.params", "parameter counts of every run in a config (CSV)"),
    "plan": ("stateloop.commands.plan", "tokens, FLOPs, peak GPU memory, training time and GPU-hours of every run in a config"),
    "rehearse": ("stateloop.commands.rehearse", "run a config's own DAG offline on this machine, sizes shrunk"),
    "schema": ("stateloop.commands.schema", "JSON Schema of pipeline configs (from the config declarations)"),
    "lm-eval": ("stateloop.commands.lm_eval", "lm-eval's own command line (arguments unchanged) with the stateloop model"),
}
COMMANDS = {**PIPELINE, **TOOLS}


def version() -> str:
    """The installed distribution's version (pyproject.toml), from its metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("stateloop")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def add_flags(parser: argparse.ArgumentParser, request: type, only: str | None = None) -> None:
    """The flags of a request, each from its field (config.arg): named as config.flag_of says, its
    help, metavar, choices; required without a default; store_true for a bool, words for a list (added
    to when given again); ``Request.of`` reads numbers. A flag not given is left out of the namespace
    (the field keeps its default). ``only``: the subcommand built (a field marked ``only``: its alone)."""
    hints = typing.get_type_hints(request)
    for f in dataclasses.fields(request):
        meta = dict(f.metadata)
        if "help" not in meta or meta.pop("only", only) != only:
            continue
        kw = {k: meta[k] for k in ("help", "metavar", "choices", "nargs", "type") if k in meta}
        if hints[f.name] is bool:
            kw["action"] = "store_true"
        elif all(typing.get_origin(k) is list for k in kinds_of(hints[f.name]) if k is not type(None)):
            kw = {"nargs": "*", **kw, **({"default": []} if meta.get("positional") else {"action": "extend"})}
        if meta.get("positional"):
            parser.add_argument(f.name, **kw)
        else:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            parser.add_argument(flag_of(f), dest=f.name, required=required, default=argparse.SUPPRESS, **kw)


def build_parser(built=COMMANDS) -> argparse.ArgumentParser:
    """The parser of every command, listed with its help; the arguments of those in ``built`` alone
    (each imports its module: :func:`run_command` builds only the one it runs)."""
    parser = argparse.ArgumentParser(
        prog="stateloop", description=__doc__.splitlines()[0].replace("``", ""),
        epilog=f"pipeline, in the DAG's order: {' -> '.join(PIPELINE)}; tools: {', '.join(TOOLS)}. "
               "`stateloop COMMAND --help` for one command.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name not in built:
            continue
        p.set_defaults(_module=module)
        command = importlib.import_module(module)
        p.epilog = getattr(command, "EPILOG", None)  # a command's exit statuses, where it lists them
        if hasattr(command, "add_arguments"):  # lm-eval's own arguments
            command.add_arguments(p)
        elif hasattr(command, "SUBCOMMANDS"):  # name -> help; the request's field marked subcommand holds the name
            dest = next(f.name for f in dataclasses.fields(command.Request) if f.metadata.get("subcommand"))
            subs = p.add_subparsers(dest=dest, required=True, metavar=dest.upper())
            for sub_name, text in command.SUBCOMMANDS.items():
                add_flags(subs.add_parser(sub_name, help=text, description=text), command.Request, only=sub_name)
        else:
            add_flags(p, command.Request)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed. A command module that names a ``PASSTHROUGH`` argument (rehearse: the words
    for Snakemake) gets every word after the first ``--`` in it, whatever comes before: argparse
    alone fills such a list at the first positional word, so an option after CONFIG left the words
    after ``--`` "unrecognized"."""
    module = COMMANDS.get(argv[0], (None,))[0] if argv else None
    passthrough = getattr(importlib.import_module(module), "PASSTHROUGH", None) if module else None
    if passthrough is None or "--" not in argv:
        return parser.parse_args(argv)
    cut = argv.index("--")
    args = parser.parse_args(argv[:cut])
    setattr(args, passthrough, [*getattr(args, passthrough, []), *argv[cut + 1:]])
    return args


def run_command(argv: list[str] | None = None) -> int:
    """Run ``stateloop ARGV`` (``sys.argv[1:]`` when None) in this process; a failure the user can
    act on is one line on stderr and an exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(build_parser(argv[:1]), argv)
    command = importlib.import_module(args._module)
    try:
        return command.run(command.Request.of(args) if hasattr(command, "Request") else args) or 0
    except (ConfigError, FileNotFoundError) as err:
        print(f"stateloop {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a folder without write permission: one line, no traceback
        print(f"stateloop {args.command}: error: {err}", file=sys.stderr)
        return 74  # EX_IOERR (sysexits.h)
    except KeyboardInterrupt:
        print(f"stateloop {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it

