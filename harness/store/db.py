"""Turning a database URL into a working engine, or into a ConfigError that says what to fix.

The store runs on SQLite (a local file, the default) or PostgreSQL (shared). Everything backend-specific
lives here: URL normalisation, SQLite's connection pragmas, PostgreSQL's driver, and the JSON encoding
both backends share so that metrics read back the same from either.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from pcg_core.errors import ConfigError

DEFAULT_DB_URL = "sqlite:///pcg.db"
BACKENDS = ("sqlite", "postgresql")
FIX = (
    "pass a SQLite file path, sqlite:///path/to/pcg.db, or postgresql+psycopg://user:password@host:5432/dbname "
    "(the URL comes from PCG_DB_URL when none is given)"
)
# JSON has no NaN or infinities and PostgreSQL's json type rejects them: store them as these strings.
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def default_db_url() -> str:
    """PCG_DB_URL if set, else a SQLite file `pcg.db` in the current directory."""
    return os.environ.get("PCG_DB_URL") or DEFAULT_DB_URL


def mask(url: str | URL) -> str:
    """The URL with its password replaced by ***, safe to print in errors and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


def normalize(url: str) -> URL:
    """A plain path (no "://") is a SQLite file; bare postgresql:// gets psycopg 3, the driver we depend on."""
    if "://" not in url:
        url = str(URL.create("sqlite", database=url))
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(f"database URL {mask(url)!r} cannot be parsed; {FIX}") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in BACKENDS:
        raise ConfigError(f"database URL {mask(url)!r}: {parsed.get_backend_name()!r} is not supported; {FIX}")
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        # Pin a relative path to today's cwd: SQLite opens it per connection, after any later chdir.
        parsed = parsed.set(database=str(Path(parsed.database).expanduser().resolve()))
    return parsed


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for PostgreSQL or an in-memory database)."""
    parsed = normalize(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def check_access(url: str, read_only: bool) -> None:
    """A SQLite file that a reader needs and is missing, or that a writer cannot write, as a ConfigError now
    (rather than a traceback from the first write, or an empty database made by a command that only reads)."""
    path = sqlite_file(url)
    if path is None:
        return
    if read_only:
        if not path.is_file():
            raise ConfigError(f"no results database at {path}: nothing has been recorded there yet (`pcgh run` "
                              f"makes one), or give the right one with --db or PCG_DB_URL")
        return
    if path.is_dir():
        raise ConfigError(f"database URL {mask(url)!r}: {path} is a folder; {FIX}")
    folder = next((p for p in path.parents if p.exists()), Path("/"))  # where its folder would be made
    if not folder.is_dir():
        return  # a file in the way: make_engine says it cannot create the folder
    if (path.exists() and not os.access(path, os.W_OK)) or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"the results database {path} is read-only here (SQLite also writes a journal beside it): "
                          f"give a writable place with --db or PCG_DB_URL")


def make_engine(url: str, create: bool = True) -> Engine:
    """An engine for `url`, with the failures of building one turned into ConfigErrors naming the URL; with
    `create`, a SQLite file's folder is made if missing."""
    parsed = normalize(url)
    kwargs: dict[str, Any] = {"json_serializer": dumps, "json_deserializer": loads}
    if parsed.get_backend_name() == "sqlite":
        if create and parsed.database not in (None, "", ":memory:"):
            try:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"database URL {mask(url)!r}: cannot create its directory ({e}); {FIX}") from e
        kwargs["connect_args"] = {"timeout": 30}  # wait for another writer instead of "database is locked"
    else:
        kwargs["pool_pre_ping"] = True  # runs last hours; a server restart must not kill the next record
        if "connect_timeout" not in parsed.query:
            kwargs["connect_args"] = {"connect_timeout": 10}
    try:
        engine = create_engine(parsed, **kwargs)
    except ImportError as e:
        raise ConfigError(f"database URL {mask(url)!r}: its driver is not installed ({e}); {FIX}") from e
    except (ArgumentError, ValueError) as e:
        raise ConfigError(f"database URL {mask(url)!r} is not valid ({e}); {FIX}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def connect_error(url: str, e: SQLAlchemyError) -> ConfigError:
    """The ConfigError for a database that cannot be reached or opened."""
    cause = str(getattr(e, "orig", None) or e).strip().splitlines()[0].rstrip(".")
    if normalize(url).get_backend_name() == "sqlite":
        check = "that the path is a file (or absent) in a writable directory"
    else:
        check = "that the server is running and the URL's host, port, user, password and database name are right"
    return ConfigError(f"cannot open the results database {mask(url)!r}: {cause}. Check {check}, or use another: {FIX}")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # SQLite ignores foreign keys unless asked, per connection; PostgreSQL always enforces them.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _encode(obj: Any) -> Any:
    """JSON-ready copy: non-finite floats as strings, tensor/numpy scalars as Python numbers, tuples as lists."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if callable(getattr(obj, "item", None)):
        return _encode(obj.item())
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable; store numbers, strings, lists and dicts")


def _decode(obj: Any) -> Any:
    if isinstance(obj, str):
        return _NONFINITE.get(obj, obj)
    if isinstance(obj, dict):
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(_encode(obj), allow_nan=False)


def loads(text: str) -> Any:
    return _decode(json.loads(text))
