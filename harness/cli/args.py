"""Argument types and checks the commands share: each turns bad input into argparse's one-line error (exit 2)
or a ConfigError naming the flag, never a traceback."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from harness.outcome import AXES
from pcg_core.errors import ConfigError

DB_HELP = "database URL or SQLite file (default: $PCG_DB_URL or sqlite:///pcg.db)"
MAX_INT_FLAG = 2**31 - 1  # past this no count or size on the command line is meant (and some overflow C ints)


def add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=db_arg, help=DB_HELP)


EXECUTORS = ("local", "ray")


def executor_arg(text: str) -> str:
    """--executor, or its default $PCG_EXECUTOR (argparse checks a string default through `type`, not `choices`)."""
    if text not in EXECUTORS:
        raise argparse.ArgumentTypeError(f"{text!r} is not an executor: {' or '.join(EXECUTORS)} (--executor, or "
                                         "its default $PCG_EXECUTOR)")
    return text


def add_executor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", type=executor_arg, default=os.environ.get("PCG_EXECUTOR") or "local",
                   metavar="{local,ray}",
                   help="where cells run: this machine, or a Ray cluster, each attempt a task on a node with the "
                        "cell's GPUs (pip install 'pcg[ray]'); default: $PCG_EXECUTOR, else local")
    p.add_argument("--address", help="with --executor ray: the cluster's address (host:port or ray://…; default: "
                                     "$RAY_ADDRESS, else a Ray started on this machine for the run)")


def db_arg(text: str) -> str:
    """--db: an empty value (an unset variable in a script: `--db "$DB"`) is not the default database."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a SQLite file or a database URL (or leave --db out for "
                                         "$PCG_DB_URL or sqlite:///pcg.db)")
    return text


def _int_in(text: str, low: int, high: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected {what} from {low} to {high}, got {value}")
    return value


def bounded_int(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type for an integer from `low` to `high`: the one pair of numbers the help and the error show."""
    def parse(text: str) -> int:
        return _int_in(text, low, high, what)

    return parse


class DefaultsShown(argparse.HelpFormatter):
    """Help that ends each option with its default, where it has one worth saying (not None, not a flag's False),
    and keeps a text of several lines (an epilog of examples) as written; one-line texts are wrapped."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        worth = action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text
        if action.option_strings and worth:
            text += " (default: %(default)s)"
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def positive_int(text: str) -> int:
    return _int_in(text, 1, MAX_INT_FLAG, "a positive integer")


def seed_int(text: str) -> int:
    return _int_in(text, 0, 2**63 - 1, "an integer seed")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def share_float(text: str) -> float:
    """A share of a whole: 0 < share ≤ 1."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a share of at most 1 (0.1 is 10%), got {value}")
    return value


def threshold(text: str) -> float:
    """A relative change: 0 (report every change) up to 100 (100×); NaN, infinities and negatives mean nothing."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a relative change such as 0.1 (10%), got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a relative change from 0 to 100 (0.1 is 10%), got {text}")
    return value


def writable_dir(path: Path, flag: str) -> Path:
    """`path` as a folder this process can write into (created if missing), else a ConfigError naming `flag`."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is a file; give a folder (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".pcgh-write-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write there ({e.strerror or e}); give a writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot write there; give a writable folder")
    return path


def matrix_file(text: str) -> Path:
    """The matrix file `pcgh run`/`nightly` were given; a folder is refused naming the matrices in it (a missing
    or unreadable file is the bounded reader's to say)."""
    path = Path(text)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.yaml"))
        example = path / (found[0] if "smoke.yaml" not in found else "smoke.yaml") if found else None
        there = f"; e.g. {example} (files there: {', '.join(found)})" if example else " (no .yaml files there)"
        raise ConfigError(f"{path}: is a folder, not a matrix file{there}")
    return path


def axis_filter(text: str) -> dict[str, str]:
    """--filter AXIS=GLOB (pcgh run, pcgh nightly)."""
    axis, sep, pattern = text.partition("=")
    if not sep or axis not in AXES or not pattern:
        raise argparse.ArgumentTypeError(f"expected AXIS=GLOB with AXIS one of {', '.join(AXES)}, got {text!r}")
    return {axis: pattern}


def shard_arg(text: str) -> tuple[int, int]:
    """--shard I/N with 0 ≤ I < N."""
    m = text.split("/")
    if len(m) != 2 or not all(x.isdigit() for x in m) or not 0 <= int(m[0]) < int(m[1]):
        raise argparse.ArgumentTypeError(f"expected I/N with 0 ≤ I < N, got {text!r}")
    return int(m[0]), int(m[1])
