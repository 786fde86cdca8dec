"""`pcgh`: one command line for pcg: `run` a matrix (or the `nightly`, gated by its policy), `report` and `diff` runs, one `cell`, the `models`, model
`request`s and the `requests` recorded. Installed packages add commands through the `pcgh.commands` entry-point
group (the dashboard adds `serve`), so the harness never imports them.

Each command is a module here that adds its parser and sets its handler; a handler imports what it runs when it
runs, so `pcgh --help` and the commands that only read the store start without torch. Bad input is one line and
exit 2 (EXIT_BAD_INPUT), never a traceback: argparse's own errors, a ConfigError from anywhere below, and an
OSError on a path the user gave. So are the other ways a command ends that are not bugs: a module of an extra that
is not installed (a lean `pcg[web]` install has no torch), Ctrl-C (130) and a reader that closed the pipe (141).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from harness.cli import cell, models, nightly, runs
from harness.cli.args import DefaultsShown
from harness.cli.cell import spec_from_args
from pcg_core.errors import ConfigError

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAIL", "EXIT_PASS", "build_parser", "error_text", "main", "spec_from_args"]

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
# What a shell reports for a tool that SIGINT or SIGPIPE ended (128 + the signal), so scripts read them alike.
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
# The top-level modules each extra brings (pyproject.toml): a missing one is an install to do, not a bug.
EXTRA_OF = {"torch": "runtime", "transformers": "runtime", "huggingface_hub": "runtime", "safetensors": "runtime",
            "fastapi": "web", "starlette": "web", "jinja2": "web", "uvicorn": "web"}
COMMANDS_GROUP = "pcgh.commands"
# The runtime's errors name the config field; on this command line the user typed a flag.
FLAGS = {"backend": "--graph", "attention": "--attention", "compiler": "--compiler", "device": "--device",
         "dtype": "--dtype", "kv_cache": "--kv-cache", "max_tokens": "--max-tokens", "layers": "--layers", "tiny": "--tiny", "weights": "--weights",
         "spec": "--model"}


def error_text(e: ConfigError, command: str) -> str:
    """The message, plus the flag that sets the field it names (for the commands that have that flag)."""
    flag = FLAGS.get(getattr(e, "field", None) or "")
    if not flag or command != "cell":
        return str(e)
    extra = ", which also takes a model-card id: `pcgh models` lists them" if flag == "--model" else ""
    return f"{e} (set by {flag}{extra})"


def _plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Commands other installed packages contribute: each entry point is `add_command(subparsers)`, which adds a
    subparser whose `handler(args) -> int` runs it."""
    for ep in entry_points(group=COMMANDS_GROUP):
        try:
            add_command = ep.load()
        except ImportError as e:  # its extra is not installed: the command says so instead of pcgh failing
            p = sub.add_parser(ep.name, help=f"(unavailable: {e.name or e} is not installed)")
            p.set_defaults(handler=_unavailable(ep.name, e), takes_any_arguments=True)
            continue
        add_command(sub)


def _unavailable(name: str, e: ImportError) -> Callable[[argparse.Namespace], int]:
    def handler(_: argparse.Namespace) -> int:
        raise ConfigError(f"`pcgh {name}` needs {e.name or 'a package'} ({e}); install the extra that brings it "
                          f"(the dashboard's, from a checkout: pip install -e \".[web]\")")

    return handler


# `pcgh --help`'s epilog: a first session, in order.
EXAMPLES = """examples:
  pcgh run harness/configs/quick.yaml --jobs 2      # a first look: 13 cells on the CPU into pcg.db, a summary at the end
  pcgh run harness/configs/smoke.yaml --dry-run     # the whole CPU matrix's cells and their pre-check; nothing runs
  pcgh runs                                         # the runs recorded, newest first: their ids
  pcgh report latest --out reports/                 # the whole report of a run
  pcgh diff 1 latest --fail-on-regression           # what changed between two runs
  pcgh cell --model qwen3-0.6b --tiny --graph full  # one cell, judged
  pcgh models                                       # the model cards a matrix can name
  pcgh serve                                        # the dashboard over pcg.db
`pcgh COMMAND --help` says more of each; docs/cli.md has the rest."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcgh", description="pcg: piecewise CUDA graphs, judged against eager",
                                     epilog=EXAMPLES, formatter_class=DefaultsShown)
    sub = parser.add_subparsers(dest="command", required=True)
    runs.add(sub)
    nightly.add(sub)
    cell.add(sub)
    models.add(sub)
    _plugin_commands(sub)
    return parser


def missing_extra_text(e: ModuleNotFoundError) -> str | None:
    """What to install when `e` is a module of one of our extras; None for any other missing module (a bug)."""
    module = (e.name or "").split(".")[0]
    extra = EXTRA_OF.get(module)
    if extra is None:
        return None
    return f"needs {module} ({e}); install the {extra} extra from pcg's checkout: pip install -e \".[{extra}]\""


def interrupted_text(args: argparse.Namespace | None) -> str:
    """Ctrl-C's one line; for a run, the command that finishes it (the run was marked interrupted)."""
    command = getattr(args, "command", None)
    if command not in ("run", "nightly") or getattr(args, "dry_run", False):
        return f"pcgh{' ' + command if command else ''}: interrupted"
    assert args is not None  # the command came from it
    again = [f"pcgh {command} {args.matrix} --resume"]
    if args.db:
        again.append(f"--db {args.db}")
    if str(args.logs) != "pcg-logs":
        again.append(f"--logs {args.logs}")
    return f"pcgh {command}: interrupted; `{' '.join(again)}` finishes the run"


def _quiet_stdout() -> None:
    """The reader of our stdout is gone (`pcgh report | head`): what is still buffered goes nowhere, so the
    interpreter's flush at exit does not raise BrokenPipeError again (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is no file (captured): nothing is flushed at exit


def main(argv: list[str] | None = None) -> int:
    args = None

    def fail(text: str) -> int:
        print(f"pcgh{' ' + args.command if args else ''}: error: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT

    try:
        from pcg_core.plugins import load_plugins

        try:
            load_plugins()
        except ConfigError as e:
            return fail(str(e))
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown and not getattr(args, "takes_any_arguments", False):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        code = args.handler(args)
        sys.stdout.flush()  # a reader that closed the pipe shows here, inside the try, not at exit
        return code
    except ConfigError as e:
        return fail(error_text(e, args.command) if args else str(e))
    except ModuleNotFoundError as e:
        text = missing_extra_text(e)
        if text is None:
            raise  # not an extra's module: a fault of ours, with its traceback
        return fail(text)
    except KeyboardInterrupt:
        print(interrupted_text(args), file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except SystemExit as e:  # rich's Console meets a closed pipe with exit 1 (on_broken_pipe): 1 is a failed cell here
        if isinstance(e.__context__, BrokenPipeError):
            return EXIT_BROKEN_PIPE
        raise
    except OSError as e:
        if e.filename is None:
            raise  # not about a path: a fault of ours or of the machine, with its traceback
        hint = " (--models-dir: the folder --write-card writes into)" if getattr(args, "write_card", False) else ""
        return fail(f"{e.filename}: {e.strerror or e}{hint}")


if __name__ == "__main__":
    raise SystemExit(main())
