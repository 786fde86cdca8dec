"""The model_requests table: recording, duplicates, statuses, `pcgh requests` — on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC

import pytest

from harness.store import RequestNotFound, Store
from request_helpers import REPO_CONFIGS, cache_config, load_config

ROW = {"model": "Qwen/Qwen3-0.6B", "revision": None, "config_hash": "a" * 64, "architecture": "Qwen3ForCausalLM",
       "supported": True, "verdict": {"features": [], "verdicts": {"model": {"ok": True, "reason": "in the table"}}}}


def test_record_and_read_back(db_url):
    with Store(db_url) as store:
        rid = store.record_request(ROW)
        got = store.request(rid)
    assert got.status == "requested" and got.card_id is None and got.supported is True
    assert got.verdict == ROW["verdict"] and got.created_at.tzinfo == UTC


def test_requests_newest_first_and_by_status(db_url):
    with Store(db_url) as store:
        a = store.record_request(ROW)
        b = store.record_request({**ROW, "model": "Qwen/Qwen3-8B", "config_hash": "b" * 64})
        store.set_request_status(a, "in_matrix", card_id="qwen3-0.6b")
        assert [r.id for r in store.requests()] == [b, a]
        assert [r.id for r in store.requests(status="in_matrix")] == [a]
        assert store.request(a).card_id == "qwen3-0.6b"
        store.set_request_status(a, "passing")
        assert store.request(a).card_id == "qwen3-0.6b"  # unchanged unless given
        assert len(store.requests(limit=1)) == 1


def test_duplicates_by_model_revision_and_by_config_hash(db_url):
    with Store(db_url) as store:
        first = store.record_request(ROW)
        other_rev = store.record_request({**ROW, "revision": "v2", "config_hash": "c" * 64})
        local_copy = store.record_request({**ROW, "model": "/tmp/x/config.json", "config_hash": "a" * 64})
        dups = store.duplicate_requests("Qwen/Qwen3-0.6B", "main", "a" * 64)  # None and "main" are one revision
        assert [(d.id, d.match) for d in dups] == [(first, ["model+revision", "config_hash"]), (local_copy, ["config_hash"])]
        assert [d.id for d in store.duplicate_requests("Qwen/Qwen3-0.6B", "v2", "z" * 64)] == [other_rev]
        assert store.duplicate_requests(None, None, "z" * 64) == []


def test_bad_rows_and_statuses_are_refused(db_url):
    with Store(db_url) as store:
        with pytest.raises(ValueError, match="missing keys"):
            store.record_request({"model": "x"})
        with pytest.raises(ValueError, match="not one of requested, accepted, in_matrix, passing, failing, unsupported"):
            store.record_request({**ROW, "status": "done"})
        with pytest.raises(RequestNotFound, match="no model request 99"):
            store.set_request_status(99, "passing")
        with pytest.raises(ValueError, match="not one of"):
            store.requests(status="done")


def test_existing_store_api_still_works_beside_requests(db_url):
    with Store(db_url) as store:
        run = store.create_run("smoke", "harness/configs/smoke.yaml", {"git_sha": "abc"})
        store.record_request(ROW)
        store.finish_run(run)
        assert store.run("latest").status == "finished" and len(store.requests()) == 1


def test_asking_twice_is_one_queue_row_its_analysis_refreshed(request_json, pcgh, db, tmp_path):
    path = REPO_CONFIGS / "Qwen__Qwen3-8B.json"
    first = request_json(path)
    assert first["duplicates"] == [] and first["requested_before"] is False
    second = request_json(path, "--quant", "fp8")
    assert (second["request_id"], second["requested_before"], second["duplicates"]) == (first["request_id"], True, [])
    with Store(db) as store:
        [row] = store.requests()
        store.set_request_status(row.id, "failing")  # a nightly judged it meanwhile
    assert row.verdict["requested"]["quant"] == ["fp8"]  # the last asking's analysis
    rc, out, _ = pcgh("request", path, "--db", db)
    assert rc == 0 and f"already requested as #{first['request_id']}" in out
    with Store(db) as store:
        [row] = store.requests()
    assert row.status == "failing" and row.verdict["requested"]["quant"] is None  # the history stays
    copy = tmp_path / "config.json"  # the same config at another path: its own row, the first named as a hint
    copy.write_text(path.read_text())
    third = request_json(copy)
    assert third["request_id"] != first["request_id"] and third["requested_before"] is False
    assert [(d["id"], d["match"]) for d in third["duplicates"]] == [(first["request_id"], ["config_hash"])]
    assert third["verdicts"] == first["verdicts"]


def test_same_hub_id_and_revision_is_one_request_even_if_the_config_changed(request_json, offline):
    commit_a, commit_b = "a" * 40, "b" * 40
    cache_config(offline, "pcg-test/M", load_config("Qwen__Qwen3-0.6B.json"), commit_a, refs=("main",))
    first = request_json("pcg-test/M")
    (offline / "models--pcg-test--M" / "snapshots" / commit_b).mkdir()
    (offline / "models--pcg-test--M" / "snapshots" / commit_b / "config.json").write_text(
        json.dumps(load_config("Qwen__Qwen3-0.6B.json") | {"rope_theta": 1}))
    (offline / "models--pcg-test--M" / "refs" / "main").write_text(commit_b)
    second = request_json("pcg-test/M")
    assert second["config_hash"] != first["config_hash"]
    assert (second["request_id"], second["requested_before"], second["duplicates"]) == (first["request_id"], True, [])
    third = request_json("pcg-test/M", "--revision", commit_a)  # another revision: another request
    assert third["request_id"] != first["request_id"] and third["requested_before"] is False


def test_queue_request_keeps_one_row_per_model(db_url):
    with Store(db_url) as store:
        first, new = store.queue_request({**ROW, "card_id": "qwen3-0.6b"}, config={"a": 1})
        assert new is True
        store.record_request_outcome(first, store.create_run("nightly", "n.yaml", {}), "passing", "6 of 6 cells pass")
        again = {**ROW, "revision": "main", "config_hash": "b" * 64, "supported": False}  # None and "main": one revision
        assert store.queue_request(again, config={"a": 2}) == (first, False)
        got = store.request(first)
        assert (got.status, got.card_id, got.config_hash, got.supported) == ("passing", "qwen3-0.6b", "b" * 64, False)
        assert store.request_config(first) == {"a": 2} and len(store.request_outcomes(first)) == 1
        assert store.queue_request({**ROW, "revision": "v2"})[1] is True  # another revision: another request
        local = {**ROW, "model": "/tmp/x/config.json"}
        lid = store.queue_request(local, same_config=True)[0]
        assert store.queue_request(local, same_config=True) == (lid, False)
        assert store.queue_request({**local, "config_hash": "c" * 64}, same_config=True)[1] is True  # the file now holds another config
        assert len(store.requests()) == 4


def test_pcgh_requests_lists_them(pcgh, request_json, db, tmp_path):
    request_json(REPO_CONFIGS / "Qwen__Qwen3-0.6B.json")
    # an architecture the runtime lacks: Qwen3's config read as OLMo-2's (transformers has it, pcg's table does not)
    olmo = {**json.loads((REPO_CONFIGS / "Qwen__Qwen3-0.6B.json").read_text()), "architectures": ["Olmo2ForCausalLM"],
            "model_type": "olmo2"}
    (tmp_path / "olmo2.json").write_text(json.dumps(olmo))
    request_json(tmp_path / "olmo2.json")
    rc, out, err = pcgh("requests", "--db", db, "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert [r["architecture"] for r in rows] == ["Olmo2ForCausalLM", "Qwen3ForCausalLM"]
    assert [r["supported"] for r in rows] == [False, True] and rows[0]["status"] == "requested"
    assert rows[1]["card_id"] == "qwen3-0.6b"  # the seed config's file name tells its hub id, which has a card
    rc, out, _ = pcgh("requests", "--db", db)
    assert rc == 0 and "Olmo2ForCausalLM" in out and "requested" in out
    rc, out, _ = pcgh("requests", "--db", db, "--status", "passing", "--json")
    assert rc == 0 and json.loads(out) == []
    rc, _, err = pcgh("requests", "--db", db, "--status", "done")
    assert rc == 2 and "is not a request status" in err


def test_pcgh_requests_on_an_empty_store(pcgh, db):
    rc, _, err = pcgh("requests", "--db", db)  # no database there yet: a typo'd --db is an error, as for report
    assert rc == 2 and "no results database at" in err
    Store(db).close()
    rc, out, _ = pcgh("requests", "--db", db)
    assert rc == 0 and "no model requests yet" in out
