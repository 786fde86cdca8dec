"""Hostile and careless input: uploads refused before their body is read, bad upload bodies refused before
anything is written (the database left as it was), and bad query parameters a 4xx naming them, never a 500."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from web_seed import axes, key, seed
from web_support import TOKEN

from harness.outcome import LOG_KEEP, cell_key
from harness.store import Store
from web.app import create_app

AUTH = {"Authorization": f"Bearer {TOKEN}"}
BIG = str(2**70)


def _record(key: str | None = None, model: str = "qwen3-0.6b:tiny", graph: str = "full", **over: object) -> dict:
    a = axes(model, graph)
    return {"key": cell_key(a) if key is None else key, "axes": a, "status": "pass",
            "metrics": {"speedup": {"8": 2.0}}, **over}


def _run(**over: object) -> dict:
    return {"name": "up", "matrix": "m.yaml", "started_at": "2026-02-01T10:00:00Z",
            "finished_at": "2026-02-01T10:30:00Z", "results": [_record()], **over}


def _nested(depth: int) -> object:
    v: object = 1.0
    for _ in range(depth):
        v = {"8": v}
    return v


@pytest.fixture
def app_db(tmp_path: Path) -> tuple[TestClient, Path]:
    path = tmp_path / "pcg.db"
    seed(f"sqlite:///{path}")
    with TestClient(create_app(f"sqlite:///{path}", upload_token=TOKEN), raise_server_exceptions=False) as c:
        yield c, path


def _dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


@pytest.mark.parametrize("body", [
    _run(results=[_record(duration_s=float("nan"))]),
    _run(results=[_record(duration_s=-1.0)]),
    _run(results=[_record(duration_s=float("inf"))]),
    _run(results=[_record(attempt=2**63)]),
    _run(results=[_record(attempt=0)]),
    _run(results=[_record(metrics={"speedup": _nested(900)})]),
    _run(results=[_record(key="")]),
    _run(results=[_record(key="k\ud800")]),
    _run(results=[_record(axes={"model": "m:tiny"})]),
    _run(results=[_record(status="passed")]),
    _run(results=[_record(atempt=2)]),
    _run(results=[_record(), _record(graph="piecewise", duration_s=float("nan"))]),  # one bad row among good ones
    # values a run cannot record, each of which once broke a page for everyone (issue 41)
    _run(results=[_record(metrics={"speedup": {"8": 1e308}})]),  # finite, yet no speedup: the cell page 500
    _run(results=[_record(metrics={"speedup": {"8": -2.0}})]),
    _run(results=[_record(metrics={"capture_s": float("inf")})]),
    _run(results=[_record(metrics={"token_match": 1.5})]),
    _run(results=[_record(metrics={"graph_pool_bytes": 2**60})]),
    _run(results=[_record(metrics={"device": "cpu\ud800"})]),  # a lone surrogate deep in the metrics
    _run(results=[_record(metrics={"divergences": ["x" * 30_000]})]),
    _run(results=[_record(reason="\udc00 reason")]),
    _run(results=[_record(model="qwen3-0.6b")]),  # no :variant
    _run(results=[_record(model="qwen3-0.6b:huge")]),
    _run(results=[{**_record(), "axes": {**_record()["axes"], "parallel": "tp0"}}]),
    _run(results=[{**_record(), "axes": {**_record()["axes"], "graph": "full graph"}}]),
    _run(results=[_record(key=key("mixtral-8x7b:tiny", "full"))]),  # another cell's key: would take its history
    _run(results=[_record(key="k")]),
    _run(finished_at="2099-01-01T00:00:00Z", started_at="2098-12-31T00:00:00Z"),  # future: the stale banner off
    _run(started_at="2099-01-01T00:00:00Z", finished_at=None, status="running"),
    _run(provenance={"git_sha": "x" * 30_000}),
    _run(provenance={"\ud800": "x"}),  # the refused key itself in the 422 must not fail the 422
    _run(name="a\ud800b"),
    _run(name=""),
    _run(provenance={"git_sha": "\udfff"}),
    _run(provenance={"nope": "x"}),
    _run(finished_at="2026-02-01T09:00:00Z"),  # before it started
    _run(started_at="2026-02-01T10:00:00"),  # no time zone
    _run(status="running"),  # running, yet finished
], ids=lambda b: json.dumps(b, allow_nan=True)[:60])
def test_a_bad_upload_is_422_and_the_database_is_untouched(app_db, body):
    client, path = app_db
    before = _dump(path)
    text = json.dumps(body, allow_nan=True)  # NaN and Infinity as Python's json writes them
    r = client.post("/api/runs", content=text.encode("utf-8", "surrogatepass"), headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 422, (r.status_code, r.text[:300])
    assert _dump(path) == before


def test_an_upload_with_every_metric_a_run_records_is_taken(app_db):
    """The range checks refuse no value a real cell records: large token counts as keys, NaN judge measurements."""
    client, _ = app_db
    metrics = {"speedup": {"8": 2.0, "65536": 1.01}, "latency_ms": {"65536": {"eager": 900.0, "graph": 890.0}},
               "bucket_hits": {"131072": 3}, "max_prompt_logprob_diff": float("nan"), "max_prompt_kl": float("inf"),
               "seed": 2**31, "graph_pool_bytes": 80 * 2**30, "phase_s": {"load": 3.5}, "token_match": 1.0,
               "reference": {"status": "pass", "kernel_rel": 0.01, "positions": 400}}
    text = json.dumps(_run(results=[_record(metrics=metrics)]), allow_nan=True)
    r = client.post("/api/runs", content=text, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 201, r.text[:300]


def test_uploads_are_parsed_and_written_in_another_process(app_db):
    """The route only hands the bytes on (web.uploads): parsing, checking and the write run in the upload
    worker's process, so the event loop and this process's GIL never carry a big upload."""
    import os

    from web import uploads
    client, path = app_db
    r = client.post("/api/runs", json=_run(), headers=AUTH)
    assert r.status_code == 201, r.text
    workers = {p.pid for p in uploads._worker_pool()._processes.values()}
    assert workers and os.getpid() not in workers
    with Store(f"sqlite:///{path}") as store:
        assert store.run(r.json()["id"]).name == "up"
    bad = client.post("/api/runs", json=_run(name=""), headers=AUTH)  # refused there, answered here
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][0] == "name", bad.text


def test_a_good_upload_keeps_only_the_documented_end_of_a_log(app_db):
    client, path = app_db
    log = "x" * (LOG_KEEP + 5000) + "the error at the end"
    r = client.post("/api/runs", json=_run(results=[_record(log=log)]), headers=AUTH)
    assert r.status_code == 201, r.text
    with Store(f"sqlite:///{path}") as store:
        (rec,) = store.results(r.json()["id"])
    assert len(rec.log) == LOG_KEEP and rec.log.endswith("the error at the end")


def _asgi_post(app, headers: dict[str, str]) -> tuple[int, bool]:
    """POST /api/runs straight through the ASGI app; (status, whether any of the body was read)."""
    read = False
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal read
        read = True
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/runs", "raw_path": b"/api/runs", "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("test", 80), "client": ("1.2.3.4", 5), "http_version": "1.1",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(app(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), read


@pytest.mark.parametrize("headers,status", [
    ({"content-length": str(30 * 2**20)}, 401),  # a stranger's 30 MB: refused from the headers
    ({"content-length": "2", "authorization": "Bearer wrong"}, 401),
    ({"authorization": f"Bearer {TOKEN}"}, 411),  # no length
    ({"authorization": f"Bearer {TOKEN}", "content-length": str(65 * 2**20)}, 413),  # over the default cap
])
def test_uploads_are_refused_from_their_headers_before_the_body_is_read(tmp_path, headers, status):
    app = create_app(seed(f"sqlite:///{tmp_path / 'pcg.db'}").url, upload_token=TOKEN)
    got, read = _asgi_post(app, headers)
    assert (got, read) == (status, False)
    got, read = _asgi_post(app, {"authorization": f"Bearer {TOKEN}", "content-length": "2", "content-type": "application/json"})
    assert got == 422 and read  # the guard lets a sound upload through to validation


def test_the_cap_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PCG_UPLOAD_MAX_MB", "1")
    app = create_app(seed(f"sqlite:///{tmp_path / 'pcg.db'}").url, upload_token=TOKEN)
    assert _asgi_post(app, {"authorization": f"Bearer {TOKEN}", "content-length": str(2 * 2**20)}) == (413, False)
    monkeypatch.setenv("PCG_UPLOAD_MAX_MB", "lots")
    from pcg_core.errors import ConfigError

    with pytest.raises(ConfigError, match="PCG_UPLOAD_MAX_MB"):
        create_app(f"sqlite:///{tmp_path / 'pcg.db'}", upload_token=TOKEN)


@pytest.mark.parametrize("url,status", [
    ("/diff?threshold=inf", 422), ("/diff?threshold=nan", 422), ("/api/diff?threshold=1e400", 422),
    (f"/runs?limit={BIG}", 422), (f"/api/runs?limit={BIG}", 422),
    (f"/runs/{BIG}", 404), (f"/api/runs/{BIG}", 404), (f"/?run={BIG}", 404), (f"/api/matrix?run={BIG}", 404),
    (f"/diff?base={BIG}&head=latest", 404), ("/api/runs/0", 404), ("/runs/-1", 404),
    (f"/cell?key=x&run={BIG}", 404), (f"/api/cell?key=x&run={BIG}", 404),
    ("/badge/matrix/%ED%A0%80.svg", 200), ("/?run=%ED%A0%80", 404), ("/cell?key=%ED%A0%80", 404),
])
def test_bad_query_parameters_are_4xx_never_500(sqlite_client, url, status):
    r = sqlite_client.get(url)
    assert r.status_code == status, (url, r.status_code, r.text[:200])
    if status == 422:
        assert r.json()["detail"][0]["loc"][-1] in ("threshold", "limit")  # names the parameter


@pytest.mark.parametrize("url", ["/", "/api/runs", "/badge/matrix/smoke.svg", "/static/style.css", "/docs",
                                 "/openapi.json", "/no/such/page", "/static/swagger/swagger-ui.css"])
def test_every_response_carries_the_security_headers(sqlite_client, url):
    r = sqlite_client.get(url)
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert ("script-src 'self'" in csp) == (url == "/docs")  # only /docs runs scripts, and only its own


@pytest.mark.parametrize("name,status", [("swagger-ui-bundle.js", 200), ("swagger-ui.css", 200), ("favicon-32x32.png", 200),
                                         ("index.html", 404), ("swagger-initializer.js", 404), ("oauth2-redirect.html", 404),
                                         ("..%2F..%2Fapp.py", 404)])
def test_only_the_swagger_files_docs_loads_are_served(sqlite_client, name, status):
    assert sqlite_client.get(f"/static/swagger/{name}").status_code == status


def _request_body() -> dict:
    from harness.request.analyze import analyze
    with open("harness/models/configs/Qwen__Qwen3-0.6B.json") as f:
        config = json.load(f)
    report = analyze(config, model="org/probe-0.6b", source="hub", revision=None, quants=None, tps=None)
    return {**report, "config": config}


@pytest.mark.parametrize("bad", ["surrogate_in_verdict", "huge_model", "nan", "surrogate_in_config"])
def test_a_bad_request_report_is_422_and_the_database_is_untouched(app_db, bad):
    client, path = app_db
    body = _request_body()
    if bad == "surrogate_in_verdict":  # was stored, then /requests and /api/requests 500 even after a restart
        body["verdicts"]["model"]["reason"] = "ok \ud800"
    elif bad == "huge_model":  # a 10 MiB model string was stored and served
        body["model"] = "org/" + "m" * (10 * 2**20)
    elif bad == "nan":
        body["extra_number"] = float("nan")
    else:
        body["config"]["model_type"] = "qwen3\udfff"
    before = _dump(path)
    text = json.dumps(body, allow_nan=True)
    r = client.post("/api/requests", content=text.encode("utf-8", "surrogatepass"),
                    headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 422, (r.status_code, r.text[:300])
    assert _dump(path) == before
    ok = client.post("/api/requests", json=_request_body(), headers=AUTH)  # the same report, unspoiled, is taken
    assert ok.status_code == 201, ok.text[:300]


def test_rows_stored_before_the_checks_still_render(app_db):
    """Defence in depth: rows an older server accepted (a 1e308 speedup, a lone surrogate, a model without its
    variant) render their pages, with the odd text replaced, instead of a 500 for everyone."""
    from harness.outcome import CellRecord
    client, path = app_db
    odd = [CellRecord.model_validate(_record(metrics={"speedup": {"8": 1e308}, "capture_s": 1.0})),
           CellRecord.model_validate(_record(graph="piecewise", metrics={"device": "cpu\ud800"}, reason="r \udc00")),
           CellRecord.model_validate(_record(model="qwen3-0.6b"))]
    with Store(f"sqlite:///{path}") as store:
        run_id = store.import_run("old", "m.yaml", {}, odd)
        store.queue_request({"model": "org/old", "revision": None, "config_hash": "h", "architecture": "A",
                             "supported": True, "verdict": {"reason": "x \ud800"}, "status": "requested"})
    for record in odd:
        for url in ("/cell", "/api/cell"):
            r = client.get(url, params={"key": record.key, "run": run_id})
            assert r.status_code == 200, (url, record.key, r.status_code)
            assert "\ufffd" in r.text or "\\ufffd" in r.text or record.metrics.settings.device != "cpu\ud800"
    for url in (f"/runs/{run_id}", f"/api/runs/{run_id}", "/", "/requests", "/api/requests"):
        assert client.get(url).status_code == 200, url
    page = client.get("/cell", params={"key": odd[2].key, "run": run_id}).text
    assert "no repro command" in page
