"""`pcgh`: one command line for pcg: `run` a matrix (or the `nightly`, gated by its policy), `report` and `diff` runs, one `cell`, the `models`, model
`request`s and the `requests` recorded. Installed packages add commands through the `pcgh.commands` entry-point
group (the dashboard adds `serve`), so the harness never imports them.

Each command is a module here that adds its parser and sets its handler; a handler imports what it runs when it
runs, so `pcgh --help` and the commands that only read the store start without torch. Bad input is one line and
exit 2 (EXIT_BAD_INPUT), never a traceback: argparse's own errors, a ConfigError from anywhere below, and an
OSError on a path the user gave.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from harness.cli import cell, models, nightly, runs
from harness.cli.args import DefaultsShown
from harness.cli.cell import spec_from_args
from pcg_core.errors import ConfigError

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAIL", "EXIT_PASS", "build_parser", "error_text", "main", "spec_from_args"]

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
COMMANDS_GROUP = "pcgh.commands"
# The runtime's errors name the config field; on this command line the user typed a flag.
FLAGS = {"backend": "--graph", "attention": "--attention", "compiler": "--compiler", "device": "--device",
         "dtype": "--dtype", "max_tokens": "--max-tokens", "layers": "--layers", "tiny": "--tiny", "weights": "--weights",
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
  pcgh run harness/configs/smoke.yaml --jobs 2      # the smoke matrix on the CPU into pcg.db; a summary at the end
  pcgh run harness/configs/smoke.yaml --dry-run     # its cells and the pre-check's verdicts; nothing runs
  pcgh runs                                         # the runs recorded, newest first: their ids
  pcgh report latest --out reports/                 # the whole report of a run
  pcgh diff 1 latest --fail-on-regression           # what changed between two runs
  pcgh cell --model qwen3-0.6b --tiny --graph full  # one cell, judged
  pcgh models                                       # the model cards a matrix can name
  pcgh serve                                        # the dashboard over pcg.db
`pcgh COMMAND --help` says more of each; README.md has the rest."""


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


def main(argv: list[str] | None = None) -> int:
    from pcg_core.plugins import load_plugins

    try:
        load_plugins()
    except ConfigError as e:
        print(f"pcgh: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.handler(args)
    except ConfigError as e:
        print(f"pcgh {args.command}: error: {error_text(e, args.command)}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
