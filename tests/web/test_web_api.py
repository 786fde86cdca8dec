"""The JSON API on a seeded database, SQLite and PostgreSQL: numbers checked against harness/reports and the
seeded plan (web_seed), uploads checked for their token and their validation."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from web_seed import MODELS, Seeded, axes, key
from web_support import TOKEN

from harness.reports import diff_runs, results_frame, totals
from harness.store import Store
from web.app import create_app

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_runs_newest_first_with_counts_and_freshness(client: TestClient, seeded: Seeded) -> None:
    body = client.get("/api/runs").json()
    assert [r["run"]["id"] for r in body["runs"]] == seeded.run_ids[::-1]
    latest = body["runs"][0]
    assert latest["run"]["name"] == "smoke" and latest["cells"] == 24
    assert latest["counts"] == {"pass": 18, "pass_flaky": 1, "fail_capture": 1, "timeout": 1, "eager_fail": 1,
                                "unsupported": 2}
    assert (latest["passing"], latest["counted"]) == (19, 21)
    assert latest["pass_rate"] == pytest.approx(19 / 21)
    assert body["runs"][2]["counts"] == {"pass": 19, "oom": 1, "timeout": 1, "eager_fail": 1, "unsupported": 2}
    assert body["runs"][2]["wall_s"] == 41 * 60
    f = body["freshness"]
    assert f["stale"] is True and f["newest_nightly_id"] == seeded.run_ids[1] and f["age_s"] > 86400
    assert [r["run"]["id"] for r in client.get("/api/runs?limit=1").json()["runs"]] == [seeded.latest]


def test_run_totals_are_the_reports_totals(client: TestClient, seeded: Seeded) -> None:
    with Store(seeded.url) as store:
        expected = totals(results_frame(store.results(seeded.latest)))
    body = client.get(f"/api/runs/{seeded.latest}").json()
    assert body["counts"] == expected.counts
    assert body["pass_rate"] == pytest.approx(expected.pass_rate)
    assert body["geomean_speedup"] == pytest.approx(expected.geomean_speedup)
    assert body["speedup_cells"] == expected.speedup_cells == 19
    assert body["run"]["git_sha"] == f"{3:040x}" and body["run"]["host"] == "host-3"
    assert body["previous_id"] == seeded.run_ids[1]
    assert [(c["status"], c["key"]) for c in body["failing"]] == [  # recording order
        ("fail_capture", key("mixtral-8x7b:tiny", "full")), ("timeout", key("qwen3-8b:trim:4", "piecewise", "flash"))]
    assert client.get("/api/runs/latest").json()["run"]["id"] == seeded.latest


def test_missing_runs_are_404_with_the_store_message(client: TestClient) -> None:
    r = client.get("/api/runs/99")
    assert r.status_code == 404 and "no run 99" in r.json()["detail"] and "newest is run 3" in r.json()["detail"]
    assert client.get("/api/matrix?run=99").status_code == 404
    assert client.get("/api/diff?base=1&head=99").status_code == 404


def test_matrix_default_is_the_latest_run_grouped_by_graph(client: TestClient, seeded: Seeded) -> None:
    body = client.get("/api/matrix").json()
    assert body["run"]["id"] == seeded.latest and body["group"] == "graph"
    assert body["total"] == body["shown"] == len(body["cells"]) == 24
    assert body["models"] == sorted(MODELS)
    assert [(c["group"], c["config"]["attention"]) for c in body["columns"]] == [
        ("breakable", "flash"), ("breakable", "sdpa"), ("full", "flash"), ("full", "sdpa"), ("piecewise", "flash"),
        ("piecewise", "sdpa")]
    by_key = {c["key"]: c for c in body["cells"]}
    broken = by_key[key("mixtral-8x7b:tiny", "full")]
    assert (broken["status"], broken["label"], broken["reason"]) == ("fail_capture", "cap", "RuntimeError: capture failed in piece 3")
    ok = by_key[key("qwen3-0.6b:tiny", "piecewise")]
    assert ok["label"] == f"{ok['speedup']:.2f}×" and ok["capture_s"] == pytest.approx(1.1)
    assert ok["graph_pool_bytes"] == 7 * 2**20 and ok["token_match"] == 1.0
    flaky = by_key[key("llama-3.1-8b:tiny", "breakable")]
    assert flaky["status"] == "pass_flaky" and flaky["label"].startswith("~")  # the final attempt, not attempt 1
    assert body["options"]["graph"] == ["breakable", "full", "piecewise"]
    assert body["options"]["status"] == ["pass", "pass_flaky", "fail_capture", "timeout", "eager_fail", "unsupported"]


@pytest.mark.parametrize(("query", "shown"), [
    ("graph=full", 8),
    ("graph=full&graph=piecewise", 16),
    ("graph=full,piecewise", 16),
    ("model=qwen3-*", 12),
    ("model=qwen3-*&attention=flash", 6),
    ("status=failing", 2),
    ("status=not_counted", 3),
    ("status=passing&graph=full", 4),
    ("status=unsupported", 2),
    ("model=", 24),
    ("model=nothing-like-this", 0),
])
def test_matrix_filters(client: TestClient, query: str, shown: int) -> None:
    body = client.get(f"/api/matrix?{query}").json()
    assert (body["total"], body["shown"], len(body["cells"])) == (24, shown, shown)
    assert sum(body["counts"].values()) == shown


def test_matrix_group_and_run_choice(client: TestClient, seeded: Seeded) -> None:
    body = client.get(f"/api/matrix?run={seeded.run_ids[0]}&group=attention").json()
    assert body["run"]["id"] == seeded.run_ids[0]
    assert [c["group"] for c in body["columns"]] == ["flash"] * 3 + ["sdpa"] * 3
    assert {c["label"] for c in body["cells"] if c["status"] == "oom"} == {"OOM"}
    r = client.get("/api/matrix?group=model")
    assert r.status_code == 422 and "choose one of quant, attention, parallel, graph, compiler" in r.json()["detail"]


def test_cell_history_flips_and_repro(client: TestClient, seeded: Seeded) -> None:
    k = key("qwen3-0.6b:tiny", "breakable")
    body = client.get("/api/cell", params={"key": k}).json()
    assert body["run_id"] == seeded.latest and body["axes"] == axes("qwen3-0.6b:tiny", "breakable")
    assert [h["status"] for h in body["history"]] == ["pass", "fail_accuracy", "pass"]
    assert [h["run_id"] for h in body["history"]] == seeded.run_ids
    assert body["flips"] == 2 and body["flaky"] is True
    assert body["repro"] == ("pcgh cell --model qwen3-0.6b --tiny --weights synthetic --quant none --attention sdpa "
                             "--parallel tp1 --graph breakable --compiler eager --kv-cache auto --engine pcg --device cpu "
                             "--dtype float32 --max-tokens 64")
    assert body["history"][1]["speedup"] is None and body["history"][1]["capture_s"] == pytest.approx(1.0)
    assert body["history"][0]["speedups"] == {"8": 1.85, "32": 2.22}
    older = client.get("/api/cell", params={"key": k, "run": seeded.run_ids[1]}).json()
    assert older["status"] == "fail_accuracy" and older["reason"] == "prompt logprob diff 0.31 > 0.001"


def test_cell_retry_trim_variant_and_missing(client: TestClient, seeded: Seeded) -> None:
    retried = client.get("/api/cell", params={"key": key("llama-3.1-8b:tiny", "breakable")}).json()
    assert [h["attempts"] for h in retried["history"]] == [1, 1, 2]
    assert retried["status"] == "pass_flaky" and retried["flips"] == 1 and retried["flaky"] is True
    dead = client.get("/api/cell", params={"key": key("qwen3-8b:trim:4", "full")}).json()
    assert dead["status"] == "eager_fail" and dead["metrics"] == {} and dead["flips"] == 0 and dead["flaky"] is False
    assert dead["repro"] == ("pcgh cell --model qwen3-8b --layers 4 --weights synthetic --quant none --attention sdpa "
                             "--parallel tp1 --graph full --compiler eager --kv-cache auto --engine pcg")
    assert client.get("/api/cell", params={"key": "model=nope"}).status_code == 404
    r = client.get("/api/cell", params={"key": key("qwen3-8b:trim:4", "full"), "run": 99})
    assert r.status_code == 404 and "run 99 has no result" in r.json()["detail"]


def test_diff_is_the_reports_diff_with_new_failures_first(client: TestClient, seeded: Seeded) -> None:
    base, head = seeded.run_ids[1], seeded.latest
    body = client.get("/api/diff").json()  # defaults: latest against the run before it
    assert (body["base"]["id"], body["head"]["id"]) == (base, head)
    assert body["has_regression"] is True
    assert [(c["key"], c["base_status"], c["head_status"]) for c in body["new_failures"]] == [
        (key("mixtral-8x7b:tiny", "full"), "pass", "fail_capture")]
    assert [c["key"] for c in body["fixes"]] == [key("qwen3-0.6b:tiny", "breakable")]
    assert [c["head_status"] for c in body["flips"]] == ["pass_flaky"]
    with Store(seeded.url) as store:
        expected = diff_runs(store.results(base), store.results(head))
    assert len(body["new_failures"]) == len(expected.new_failures) and body["added"] == expected.added == []
    assert body["markdown"].index("## New failures") < body["markdown"].index("## Fixes")
    back = client.get(f"/api/diff?base={head}&head={seeded.run_ids[0]}&threshold=0").json()
    with Store(seeded.url) as store:
        expected = diff_runs(store.results(head), store.results(seeded.run_ids[0]), speedup_threshold=0)
    assert [c["key"] for c in back["new_failures"]] == [c.key for c in expected.new_failures] == [
        key("mixtral-8x7b:tiny", "breakable", "flash")]
    assert [(c["key"], c["rel_change"]) for c in back["speedup_changes"]] == [
        (c.key, pytest.approx(c.rel_change)) for c in expected.speedup_changes]
    assert len(back["speedup_changes"]) == 18 and all(c["rel_change"] < 0 for c in back["speedup_changes"])
    assert [(c["key"], c["rel_change"]) for c in back["latency_changes"]] == [
        (c.key, pytest.approx(c.rel_change)) for c in expected.latency_changes]
    assert len(back["latency_changes"]) == 18 and all(c["rel_change"] > 0 for c in back["latency_changes"])
    first = client.get(f"/api/diff?head={seeded.run_ids[0]}")
    assert first.status_code == 404 and "first run" in first.json()["detail"]


# --- uploads ------------------------------------------------------------------------------------------------


GRAPH_OF = {"a": "piecewise", "b": "breakable", "c": "full"}  # three cells of one model; its key is its axes'


def _row(k: str, status: str = "pass", attempt: int = 1, **extra: Any) -> dict[str, Any]:
    return {"key": key("qwen3-0.6b:tiny", GRAPH_OF[k]), "axes": axes("qwen3-0.6b:tiny", GRAPH_OF[k]), "status": status,
            "attempt": attempt, "metrics": {"speedup": {"8": 2.0}, "device": "cuda", "dtype": "bfloat16"}, **extra}


RUN = {"name": "ci-upload", "matrix": "harness/configs/smoke.yaml", "trigger": "ci",
       "provenance": {"git_sha": "abc123", "gpu_name": "NVIDIA H200"},
       "started_at": "2026-02-01T10:00:00Z", "finished_at": "2026-02-01T10:30:00Z",
       "results": [_row("a"), _row("b", "fail_run", 1, reason="boom"), _row("b", "pass_flaky", 2), _row("c", "unsupported")]}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                                     {"Authorization": TOKEN}])
def test_upload_without_the_right_token_is_401_and_writes_nothing(client: TestClient, headers: dict[str, str]) -> None:
    r = client.post("/api/runs", json=RUN, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert client.post("/api/requests", json={"model": "x"}, headers=headers).status_code == 401
    assert len(client.get("/api/runs").json()["runs"]) == 3


def test_upload_stores_a_run_through_the_store(client: TestClient, seeded: Seeded) -> None:
    r = client.post("/api/runs", json=RUN, headers=AUTH)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created == {"id": 4, "cells": 3, "url": "/runs/4"}
    run = client.get("/api/runs/4").json()
    assert run["run"]["trigger"] == "ci" and run["run"]["status"] == "finished" and run["run"]["gpu_name"] == "NVIDIA H200"
    assert run["run"]["started_at"].startswith("2026-02-01T10:00:00") and run["wall_s"] == 1800
    assert run["counts"] == {"pass": 1, "pass_flaky": 1, "unsupported": 1} and run["pass_rate"] == 1.0
    with Store(seeded.url) as store:
        assert len(store.results(4, all_attempts=True)) == 4
    cell = client.get("/api/cell", params={"key": key("qwen3-0.6b:tiny", "breakable")}).json()
    assert next(h for h in cell["history"] if h["run_id"] == 4)["attempts"] == 2
    assert "--device cuda --dtype bfloat16" in cell["repro"]


@pytest.mark.parametrize(("change", "message"), [
    ({"results": [_row("a", "great")]}, "Input should be 'pass', 'pass_flaky'"),
    ({"results": [{**_row("a"), "axes": {"model": "m"}}]}, "axes must have exactly"),
    ({"results": [_row("a", attempt=0)]}, "greater than or equal to 1"),
    ({"provenance": {"gpu": "x"}}, "unknown provenance keys"),
    ({"started_at": "2026-02-01T10:00:00"}, "give a time zone"),
    ({"name": ""}, "at least 1 character"),
    ({"results": [_row("a", metrics={"speedup": 3.0})]}, "Input should be a valid dictionary"),
    ({"results": [_row("a", stdout="x")]}, "Extra inputs are not permitted"),
    ({"status": "running"}, "a run still running has no finished_at"),
])
def test_upload_rejects_a_bad_body_before_writing(client: TestClient, change: dict[str, Any], message: str) -> None:
    r = client.post("/api/runs", json={**RUN, **change}, headers=AUTH)
    assert r.status_code == 422 and message in json.dumps(r.json())
    assert len(client.get("/api/runs").json()["runs"]) == 3


def test_uploads_are_off_without_a_token_and_the_env_token_works(seeded: Seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PCG_UPLOAD_TOKEN", raising=False)
    with TestClient(create_app(seeded.url)) as c:
        r = c.post("/api/runs", json=RUN, headers={"Authorization": "Bearer anything"})
        assert r.status_code == 401 and "uploads are disabled" in r.json()["detail"]
        assert c.get("/api/runs").status_code == 200  # reading stays public
    monkeypatch.setenv("PCG_UPLOAD_TOKEN", "from-env")
    with TestClient(create_app(seeded.url)) as c:
        assert c.post("/api/runs", json=RUN, headers={"Authorization": "Bearer from-env"}).status_code == 201
        assert c.post("/api/runs", json=RUN, headers=AUTH).status_code == 401


# --- requests -----------------------------------------------------------------------------------------------


def test_requests_queue_starts_empty(client: TestClient) -> None:
    assert client.get("/api/requests").json() == {"requests": []}


def test_a_submitted_request_is_queued_and_listed(client: TestClient) -> None:
    from harness.request.analyze import analyze
    with open("harness/models/configs/Qwen__Qwen3-0.6B.json") as f:
        config = json.load(f)
    report = analyze(config, model="Qwen/Qwen3-0.6B", source="hub", revision=None, quants=None, tps=None)
    body = {**report, "card_id": "qwen3-0.6b", "request_id": 12, "duplicates": [], "config": config}
    r = client.post("/api/requests", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "requested"
    [got] = client.get("/api/requests").json()["requests"]
    assert (got["id"], got["model"], got["status"], got["card_id"]) == (r.json()["id"], "Qwen/Qwen3-0.6B", "requested", "qwen3-0.6b")
    assert got["verdict"]["verdicts"]["model"]["ok"] is True and "config" not in got["verdict"]
    assert (got["matrix_cells"], got["matrix_passing"], got["matrix_counted"]) == (6, 6, 6)  # its cells in run 3
    bad = client.post("/api/requests", json={**body, "source": "carrier pigeon"}, headers=AUTH)
    assert bad.status_code == 422 and len(client.get("/api/requests").json()["requests"]) == 1
    again = client.post("/api/requests", json={**body, "card_id": None}, headers=AUTH)  # submitted twice: one row
    assert again.status_code == 200 and again.json() == r.json()
    [got] = client.get("/api/requests").json()["requests"]
    assert got["card_id"] == "qwen3-0.6b"  # a resubmission without a card keeps the card linked before


def test_a_request_accepted_with_the_token_waits_for_the_nightly_to_write_its_card(client: TestClient, seeded) -> None:
    from harness.request.analyze import analyze
    from harness.store import Store
    with open("harness/models/configs/Qwen__Qwen3-0.6B.json") as f:
        config = json.load(f)
    report = analyze(config, model="org/new-0.6b", source="hub", revision=None, quants=None, tps=None)
    changed = client.post("/api/requests", json={**report, "config": {**config, "vocab_size": 7}}, headers=AUTH)
    assert changed.status_code == 422 and "config_hash" in changed.text  # the config must be the one analyzed
    rid = client.post("/api/requests", json={**report, "hub_id": "org/new-0.6b", "config": config}, headers=AUTH).json()["id"]
    assert client.post(f"/api/requests/{rid}/accept").status_code == 401
    assert client.post("/api/requests/999/accept", headers=AUTH).status_code == 404
    r = client.post(f"/api/requests/{rid}/accept", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"id": rid, "status": "accepted", "url": "/requests"}
    assert client.post(f"/api/requests/{rid}/accept", headers=AUTH).json()["status"] == "accepted"
    [got] = client.get("/api/requests").json()["requests"]
    assert got["status"] == "accepted" and got["card_id"] is None and "config" not in got["verdict"]
    with Store(seeded.url) as store:
        assert store.request_config(rid) == config  # kept apart, for the card the nightly writes


# --- badges and docs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "text", "colour"), [
    ("/badge/model/qwen3-0.6b.svg", "6/6 pass", "#4c1"),
    ("/badge/model/llama-3.1-8b.svg", "4/4 pass", "#4c1"),  # unsupported cells are not counted
    ("/badge/model/mixtral-8x7b.svg", "5/6 pass", "#a4a61d"),
    ("/badge/model/qwen3-8b.svg", "4/5 pass", "#a4a61d"),
    ("/badge/model/no-such-model.svg", "no data", "#9f9f9f"),
    ("/badge/matrix/smoke.svg", "19/21 pass", "#97ca00"),
    ("/badge/matrix/nightly.svg", "19/21 pass", "#97ca00"),
    ("/badge/matrix/full.svg", "no data", "#9f9f9f"),
])
def test_badges(client: TestClient, path: str, text: str, colour: str) -> None:
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
    assert f">{text}</text>" in r.text and f'fill="{colour}"' in r.text
    assert r.text.startswith("<svg") and "<script" not in r.text


def test_openapi_lists_the_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert {"/api/runs", "/api/runs/{run_ref}", "/api/matrix", "/api/cell", "/api/diff", "/api/requests",
            "/badge/model/{card_id}.svg", "/badge/matrix/{name}.svg"} <= set(spec["paths"])
    assert set(spec["paths"]["/api/runs"]) == {"get", "post"}
    assert spec["paths"]["/api/runs"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "/" not in spec["paths"] and "/cell" not in spec["paths"]  # pages are not API
    # the upload's body (read as bytes, parsed in the upload worker) is still documented, every $ref resolving
    body = spec["paths"]["/api/runs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/RunIn"}
    schemas = spec["components"]["schemas"]
    assert {"results", "name", "matrix"} <= set(schemas["RunIn"]["properties"])
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(spec)))
    assert refs and refs <= set(schemas), refs - set(schemas)
