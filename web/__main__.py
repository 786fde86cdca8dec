"""`python -m web` and `pcgh serve`: the dashboard over a results store, under uvicorn.

The command lives with the dashboard, not in harness/cli.py, so the harness never imports web: pcgh finds
`add_command` through the `pcgh.commands` entry point group and calls the handler it sets.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from pcg_core.errors import ConfigError

EXIT_OK, EXIT_BAD_INPUT = 0, 2

# Fail the import, cheaply, where the dashboard's extra is missing: pcgh then lists `serve` as unavailable and
# says what to install, instead of failing when the command runs. (Importing the app itself here would cost
# every pcgh command the dashboard's start-up.)
for _dep in ("fastapi", "jinja2", "uvicorn"):
    if importlib.util.find_spec(_dep) is None:
        raise ImportError(f"the dashboard needs {_dep}, which is not installed", name=_dep)


def _port(text: str) -> int:
    n = int(text)
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (1-65535)")
    return n


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 3600]")
    return v


def _db(text: str) -> str:
    if not text.strip():  # an unset variable in a script (`--db "$DB"`), not the default database
        raise argparse.ArgumentTypeError("is empty: give a SQLite file or a database URL (or leave --db out for "
                                         "$PCG_DB_URL or sqlite:///pcg.db)")
    return text


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=_db, help="database URL or SQLite file (default: $PCG_DB_URL or sqlite:///pcg.db)")
    p.add_argument("--create", action="store_true",
                   help="start an empty database where the SQLite file does not exist yet (a dashboard that will "
                        "receive uploads); without it a missing file is an error, as a mistyped --db usually is")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--header-timeout", type=_seconds, default=10.0,
                   help="seconds a connection has to send a request's headers (else it is closed: slow clients "
                        "cannot hold connections)")
    p.add_argument("--body-timeout", type=_seconds, default=120.0,
                   help="seconds a request has to send its body after its headers")


def _serve(args: argparse.Namespace) -> int:
    from harness.store import default_db_url
    from harness.store.db import mask, sqlite_file
    from web.app import create_app
    from web.server import serve

    url = args.db or default_db_url()
    path = sqlite_file(url)
    new = path is not None and not path.exists()
    if new and not args.create:
        raise ConfigError(f"no results database at {path}: give the one `pcgh run` wrote with --db or PCG_DB_URL, "
                          "or --create to start an empty one")
    app = create_app(url)  # the upload token comes from $PCG_UPLOAD_TOKEN only: a flag would show it in `ps`
    print(f"serving {mask(url)}{' (created, empty)' if new else ''} on http://{args.host}:{args.port}",
          file=sys.stderr, flush=True)
    serve(app, args.host, args.port, header_timeout=args.header_timeout, body_timeout=args.body_timeout)
    return EXIT_OK


HELP = "the compatibility dashboard (web pages, JSON API, badges) over a results store"


def add_command(subparsers: argparse._SubParsersAction) -> None:
    """Add `serve` to a command line's subcommands; its handler is `args.handler(args) -> exit code`."""
    p = subparsers.add_parser("serve", help=HELP, description=HELP)
    _add_arguments(p)
    p.set_defaults(handler=_serve)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m web", description=HELP)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return _serve(args)
    except ConfigError as e:
        print(f"python -m web: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
