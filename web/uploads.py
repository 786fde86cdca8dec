"""An uploaded run, parsed, checked and written in a worker process: never on the event loop, never in this
process's GIL.

A nightly-sized upload (10,000 cells) takes seconds to parse and validate, a 200,000-cell one (32 MiB) longer;
done where FastAPI does it (the event loop) every concurrent request waits that long. A thread would not help:
json.loads and pydantic's validation hold the GIL for most of it. So the route hands the raw body to one
worker process (spawned, so no lock of this threaded server is inherited), which parses, checks
(web.schemas.RunIn, web.upload_checks) and writes it through its own Store; this process only copies bytes.
One worker: uploads queue behind each other, so memory is bounded by one body's parse, not by the number of
concurrent senders. Readers see the run when its transaction commits; the page cache keys on the store's
revisions (web.cache), so nothing stale is served.

An in-memory SQLite database exists only in this process: its uploads are written in a thread instead.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from pydantic import ValidationError

from harness.store import Store
from harness.store.db import sqlite_file

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _worker_pool() -> ProcessPoolExecutor:
    """The server process's upload worker, started on the first upload (a process resource, not an app's: every
    app of this process may share it, since a job carries its database URL)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_exit_with_parent, initargs=(os.getpid(),))
            atexit.register(_pool.shutdown, wait=False, cancel_futures=True)
        return _pool


def _exit_with_parent(parent: int) -> None:
    """In the worker: exit when the server process is gone. A server killed (SIGKILL, OOM) runs no atexit, and
    the worker would otherwise wait on its queue forever, holding its memory."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="pcg-upload-parent-watch", daemon=True).start()


def parse_and_import(body: bytes, url: str | None, store: Store | None = None) -> dict[str, Any]:
    """{"id", "cells"} of the run written from `body`, or {"errors": [...]} (pydantic's, without the input, which
    may be the whole body) when it is refused. Runs in the worker process with `url`, or in a thread with
    `store`."""
    from web.schemas import RunIn

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return {"errors": [{"type": "json_invalid", "loc": ["body", e.start],
                            "msg": f"not UTF-8 at byte {e.start}: send the JSON as UTF-8 (a lone surrogate cannot be)"}]}
    try:
        data = json.loads(text)  # as FastAPI reads a body: NaN and Infinity are JSON here (a measured NaN)
    except json.JSONDecodeError as e:
        return {"errors": [{"type": "json_invalid", "loc": ["body", e.pos], "msg": f"JSON decode error: {e.msg}"}]}
    except RecursionError:
        return {"errors": [{"type": "json_invalid", "loc": ["body"], "msg": "nested too deeply"}]}
    try:
        run = RunIn.model_validate(data)
    except ValidationError as e:
        return {"errors": [_readable(err) for err in e.errors(include_url=False, include_context=False, include_input=False)]}
    except RecursionError:
        return {"errors": [{"type": "value_error", "loc": ["body"], "msg": "nested too deeply"}]}
    del data, text
    own = store is None
    store = store if store is not None else Store(url)
    try:
        run_id = store.import_run(run.name, run.matrix, run.provenance, run.results, trigger=run.trigger,
                                  status=run.status, started_at=run.started_at, finished_at=run.finished_at)
    finally:
        if own:
            store.close()
    return {"id": run_id, "cells": len({r.key for r in run.results})}


def _readable(err: Any) -> dict[str, Any]:
    """A pydantic error as JSON can carry it: a lone surrogate in a key or a message (the refused text itself)
    backslash-escaped, as app.py's 422 handler does."""
    def text(v: Any) -> str:
        return str(v).encode("utf-8", "backslashreplace").decode()
    return {"loc": [x if isinstance(x, int) else text(x) for x in err.get("loc", ())], "msg": text(err.get("msg", "")),
            "type": err.get("type", "")}


def submit(body: bytes, store: Store) -> Future[dict[str, Any]]:
    """parse_and_import of `body` into `store`'s database, off this process (or, for an in-memory SQLite
    database, in a thread)."""
    if _in_memory(store.url):
        future: Future[dict[str, Any]] = Future()

        def run() -> None:
            try:
                future.set_result(parse_and_import(body, None, store))
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting route
                future.set_exception(e)

        threading.Thread(target=run, name="pcg-upload", daemon=True).start()
        return future
    return _worker_pool().submit(parse_and_import, body, store.url)


def _in_memory(url: str) -> bool:
    return url.startswith("sqlite") and sqlite_file(url) is None
