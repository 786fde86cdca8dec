"""A model request's way through `pcgh nightly`, end to end on the CPU, on SQLite and PostgreSQL: requests made
with `pcgh request`, one nightly, and each request is passing, unsupported (with the runtime's reason) or still
requested (no card), with no step between; the night's run reaches a live dashboard through --upload."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness.cards import CARDS_DIR
from harness.store import Store

CONFIGS = CARDS_DIR / "configs"
TOKEN = "nightly-upload-token"
MATRIX = """
name: nightly-requests
defaults: {device: cpu, dtype: float32, max_tokens: 16, max_new_tokens: 2, timeout_s: 300}
axes:
  model: [qwen2.5-0.5b:tiny]
  graph: [piecewise]
nightly: {requests: tiny}
"""


def _pcgh(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=900, env=env)


@pytest.fixture
def dashboard(tmp_path):
    """The real dashboard (uvicorn, its own SQLite store, an upload token) on a free port, in a thread."""
    import uvicorn

    from web.app import create_app

    url = f"sqlite:///{tmp_path / 'dashboard.db'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(url, upload_token=TOKEN), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.slow
def test_requests_move_to_their_nightly_outcome_and_the_run_is_uploaded(db_url, tmp_path, dashboard):
    base, dashboard_db = dashboard
    # Qwen3-0.6B's and Qwen3-Next's configs have cards (linked by their hub ids); a copy under another name
    # does not say its hub id, so it has no card and cannot join a matrix.
    anonymous = tmp_path / "my-model.json"
    shutil.copy(CONFIGS / "Qwen__Qwen3-0.6B.json", anonymous)
    ids = {}
    for name, path in (("qwen3", CONFIGS / "Qwen__Qwen3-0.6B.json"), ("next", CONFIGS / "Qwen__Qwen3-Next-80B-A3B-Instruct.json"),
                       ("anonymous", anonymous), ("in_matrix", CONFIGS / "Qwen__Qwen2.5-0.5B.json")):
        p = _pcgh("request", path, "--db", db_url, "--json")
        assert p.returncode == 0, p.stderr[-2000:]
        ids[name] = json.loads(p.stdout)["request_id"]
    matrix = tmp_path / "nightly-requests.yaml"
    matrix.write_text(MATRIX)
    out = tmp_path / "night"
    env = {**os.environ, "PCG_UPLOAD_TOKEN": TOKEN}
    p = _pcgh("nightly", matrix, "--db", db_url, "--logs", tmp_path / "logs", "--out", out, "--upload", base, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    with Store(db_url) as store:
        rows = {r.id: r for r in store.requests()}
        run_id = store.latest_run().id
        cells = {str(r.axes["model"]): r.status for r in store.results(run_id)}
    assert cells == {"qwen2.5-0.5b:tiny": "pass", "qwen3-0.6b:tiny": "pass", "qwen3-next-80b-a3b:tiny": "pass"}
    q, nxt, anon = rows[ids["qwen3"]], rows[ids["next"]], rows[ids["anonymous"]]
    assert q.card_id == "qwen3-0.6b" and q.status == "passing"
    assert q.outcome.run_id == run_id and q.outcome.counts == {"pass": 1} and "1 of 1" in q.outcome.reason
    assert nxt.status == "passing" and nxt.outcome.counts == {"pass": 1}  # linear attention runs since issue 39
    assert anon.card_id is None and anon.status == "requested" and anon.outcome is None
    # a card the matrix runs already: judged by the matrix's own cell, no second size of it added
    assert rows[ids["in_matrix"]].status == "passing" and rows[ids["in_matrix"]].outcome.counts == {"pass": 1}
    night = json.loads((out / "nightly.json").read_text())
    assert set(night["requests"]["moved"]) == {str(ids["qwen3"]), str(ids["next"]), str(ids["in_matrix"])}
    assert "## Model requests" in (out / "nightly.md").read_text()

    listed = _pcgh("requests", "--db", db_url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["id"]: r["status"] for r in json.loads(listed.stdout)} == {
        ids["qwen3"]: "passing", ids["next"]: "passing", ids["anonymous"]: "requested", ids["in_matrix"]: "passing"}

    # the same run, uploaded: the dashboard's store has it whole, as a nightly
    assert f"uploaded run {run_id} to {base}/api/runs: HTTP 201" in p.stdout
    with Store(dashboard_db, read_only=True) as remote:
        up = remote.latest_run()
        assert up.name == "nightly-requests" and up.trigger == "nightly" and up.status == "finished"
        assert {str(r.axes["model"]): r.status for r in remote.results(up.id)} == cells


def test_an_upload_that_cannot_succeed_stops_the_night_before_any_cell(tmp_path, monkeypatch):
    matrix = tmp_path / "nightly-requests.yaml"
    matrix.write_text(MATRIX)
    env = {k: v for k, v in os.environ.items() if k != "PCG_UPLOAD_TOKEN"}
    db = tmp_path / "pcg.db"
    p = _pcgh("nightly", matrix, "--db", f"sqlite:///{db}", "--upload", "http://127.0.0.1:9", env=env)
    assert p.returncode == 2 and "--upload needs the dashboard's token in $PCG_UPLOAD_TOKEN" in p.stderr
    p = _pcgh("nightly", matrix, "--db", f"sqlite:///{db}", "--upload", "ftp://x", env={**env, "PCG_UPLOAD_TOKEN": "t"})
    assert p.returncode == 2 and "--upload 'ftp://x' is not an http(s) URL" in p.stderr
    assert not db.exists()  # nothing ran, nothing was recorded


def test_a_bad_requests_variant_is_named(tmp_path):
    matrix = tmp_path / "nightly-requests.yaml"
    matrix.write_text(MATRIX)
    p = _pcgh("nightly", matrix, "--db", f"sqlite:///{tmp_path / 'pcg.db'}", "--requests", "huge")
    assert p.returncode == 2 and "'huge'" in p.stderr and "trim:N" in p.stderr, p.stderr
