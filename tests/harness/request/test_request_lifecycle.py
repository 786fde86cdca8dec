"""harness/request/lifecycle.py and the store's request outcomes: which requests join a nightly, what their cells
make of them, and a store made before outcomes existed still listing its requests. The nightly end to end is
tests/harness/cli/test_nightly_requests.py."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from harness.request.lifecycle import Joined, join_requests, judge, record_outcomes
from harness.store import Store
from pcg_core.errors import ConfigError
from tests.harness.reports.conftest import make_row


def _request(store: Store, card: str | None, model: str = "org/model") -> int:
    return store.record_request({"model": model, "revision": None, "config_hash": "0" * 64, "architecture": "X",
                                 "supported": True, "verdict": {}, "card_id": card})


def test_judge_by_the_cells_of_one_card():
    assert judge([]) is None  # not in this run (a shard or a filter): the request is not moved
    assert judge([make_row("a"), make_row("b", "pass_flaky")])[:2] == ("passing", "2 of 2 cells pass")
    status, why, counts = judge([make_row("a"), make_row("b", "unsupported", reason="no varlen")])
    assert status == "passing" and "1 unsupported or skipped" in why and counts == {"pass": 1, "unsupported": 1}
    status, why, _ = judge([make_row("a"), make_row("b", "fail_accuracy", reason="logprobs 0.3 > 0.1")])
    assert status == "failing" and why.startswith("1 of 2 cells fail") and "b: fail_accuracy: logprobs 0.3" in why
    assert judge([make_row("a", "eager_fail", reason="eager raised")])[0] == "failing"  # the model does not run
    assert judge([make_row("a", "timeout")])[0] == "failing"
    status, why, _ = judge([make_row("a", "unsupported", reason="arch X"), make_row("b", "unsupported", reason="arch X"),
                            make_row("c", "skipped", reason="other")])
    assert status == "unsupported" and why == "none of its 3 cell(s) runs: arch X"


def test_only_requests_with_a_loadable_card_offering_the_variant_join(db, tmp_path):
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "full-only.yaml").write_text("id: full-only\nhub_id: org/full-only\narchitecture: X\nconfig: {}\nvariants: [full]\n")
    (cards / "broken.yaml").write_text("id: broken\n")
    (cards / "ok.yaml").write_text("id: ok\nhub_id: org/ok\narchitecture: X\nconfig: {}\n")
    with Store(db) as store:
        none, gone, broken, full_only = (_request(store, c) for c in (None, "gone", "broken", "full-only"))
        first, second = _request(store, "ok"), _request(store, "ok", "org/ok-again")
        joined = join_requests(store, "trim:2", cards_dir=cards)
        in_matrix = _request(store, "qwen3-0.6b")
        present = join_requests(store, "trim:2", ["qwen3-0.6b:tiny", "qwen3-0.6b:trim:4", "llama-3.1-8b:tiny"], cards)
    assert joined.requests == {first: ["ok:trim:2"], second: ["ok:trim:2"]} and joined.models == ["ok:trim:2"]
    # a card the matrix runs already is judged by the matrix's own cells of it, at every size it runs
    assert present.requests[in_matrix] == ["qwen3-0.6b:tiny", "qwen3-0.6b:trim:4"]
    assert none not in joined.left_out  # no card: waits as requested, nothing to say
    assert "not in" in joined.left_out[gone] and "does not load" in joined.left_out[broken]
    assert "offers full, not trim:2" in joined.left_out[full_only]
    with Store(db) as store, pytest.raises(ConfigError, match="'huge'"):
        join_requests(store, "huge", cards_dir=cards)


def test_outcomes_move_the_requests_and_are_kept(db_url):
    with Store(db_url) as store:
        run = store.create_run("n", "m.yaml", {}, trigger="nightly")
        a, b = _request(store, "ok"), _request(store, "other")
        joined = Joined(requests={a: ["ok:tiny"], b: ["other:tiny"]})
        moved = record_outcomes(store, run, joined, [make_row("k1", model="ok:tiny"),
                                                     make_row("k2", "fail_run", reason="nan", model="ok:tiny")])
        assert moved == {a: ("failing", "1 of 2 cells fail; first: k2: fail_run: nan")}  # b had no cell: unmoved
        rows = {r.id: r for r in store.requests()}
        assert rows[a].status == "failing" and rows[a].outcome.run_id == run
        assert rows[a].outcome.counts == {"pass": 1, "fail_run": 1}
        assert rows[b].status == "requested" and rows[b].outcome is None
        run2 = store.create_run("n", "m.yaml", {}, trigger="nightly")
        record_outcomes(store, run2, joined, [make_row("k1", model="ok:tiny")])
        assert store.requests()[-1].status == "passing" and store.requests()[-1].outcome.run_id == run2
        assert [o.status for o in store.request_outcomes(a)] == ["failing", "passing"]
        with pytest.raises(ValueError, match="not one of"):
            store.record_request_outcome(a, run2, "great")


def test_a_store_older_than_outcomes_still_lists_its_requests(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with Store(url) as store:
        a = _request(store, "ok")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE request_outcomes"))
    engine.dispose()
    with Store(url, read_only=True) as store:
        assert [(r.id, r.outcome) for r in store.requests()] == [(a, None)] and store.request_outcomes(a) == []


def _accepted(store: Store, model: str, config: dict | None, **verdict) -> int:
    from harness.request.analyze import analyze

    report = {**analyze(config, model=model, source="hub", revision=None, quants=None, tps=None),
              "hub_id": model} if config else verdict
    rid = store.record_request({"model": model, "revision": None, "config_hash": "0" * 64, "architecture": "X",
                                "supported": True, "verdict": report, "card_id": None}, config=config)
    store.set_request_status(rid, "accepted")
    return rid


def test_an_accepted_request_gets_its_card_from_the_config_it_kept(db, models_dir):
    from tests.harness.request.request_helpers import load_config

    config = load_config("Qwen__Qwen3-0.6B.json")
    with Store(db) as store:
        new = _accepted(store, "org/brand-new-0.6b", config)
        known = _accepted(store, "Qwen/Qwen3-8B", load_config("Qwen__Qwen3-8B.json"))  # a card covers it already
        bare = _accepted(store, "org/no-config", None, hub_id="org/no-config", source="hub")
        nameless = _accepted(store, "./local/config.json", None, source="local")
        waiting = store.record_request({"model": "org/waits", "revision": None, "config_hash": "1" * 64,
                                        "architecture": "X", "supported": True, "verdict": {}, "card_id": None},
                                       config=config)  # requested, not accepted: no card is written for it
        assert store.request_config(waiting) == config
        joined = join_requests(store, "tiny", cards_dir=models_dir)
        rows = {r.id: r for r in store.requests()}
    assert joined.requests[new] == ["brand-new-0.6b:tiny"] and joined.requests[known] == ["qwen3-8b:tiny"]
    assert rows[new].card_id == "brand-new-0.6b" and rows[known].card_id == "qwen3-8b"
    card = (models_dir / "brand-new-0.6b.yaml").read_text()
    assert "hub_id: org/brand-new-0.6b" in card and (models_dir / "configs" / "org__brand-new-0.6b.json").is_file()
    assert "kept no config.json" in joined.left_out[bare] and "does not tell its hub id" in joined.left_out[nameless]
    assert waiting not in joined.requests and waiting not in joined.left_out
    assert not (models_dir / "waits.yaml").exists()
