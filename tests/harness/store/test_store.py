"""The results store on SQLite and PostgreSQL: runs, records, attempts, resume keys, errors, concurrency."""

from __future__ import annotations

import math
import threading
from datetime import datetime, timedelta, UTC
from typing import Any

import pytest
from sqlalchemy import Engine, event

from harness.metrics import CellMetrics
from harness.outcome import CellRecord
from harness.store import RequestRow, RunNotFound, RunRow, Store, default_db_url
from harness.store.models import CellResult
from pcg_core.errors import ConfigError

META = {
    "git_sha": "8c29027",
    "torch_version": "2.13.0+cpu",
    "transformers_version": "5.17.0",
    "cuda_version": "12.8",
    "driver_version": "570.86",
    "gpu_name": "NVIDIA H200",
    "host": "gpu-node-7",
}


def _keys(store: Store, run_id: int) -> set[str]:
    return {r.key for r in store.results(run_id)}


def row(axes: dict, key: str = "k1", status: str = "pass", attempt: int = 1, **extra: Any) -> CellRecord:
    return CellRecord(**{"key": key, "axes": axes, "status": status, "duration_s": 1.5, "attempt": attempt, **extra})


def test_runs_and_requests_come_out_as_typed_frozen_rows(tmp_path):
    """A misspelt column is an error at the reader, not a silent None (the dicts' `run.get("finshed_at")`)."""
    import pydantic

    with Store(str(tmp_path / "t.db")) as store:
        run = store.run(store.create_run("r", "m.yaml", META))
        rid = store.record_request({"model": "org/m", "config_hash": "a" * 64, "architecture": "X", "supported": True})
        req = store.request(rid)
    assert isinstance(run, RunRow) and isinstance(req, RequestRow) and run.provenance == META and run.finished_at is None
    with pytest.raises(AttributeError):
        run.finshed_at  # noqa: B018
    with pytest.raises(pydantic.ValidationError):
        run.status = "finished"  # frozen: a row is what the store holds, changed only through the store
    assert (req.status, req.outcome, req.match) == ("requested", None, [])


def test_run_round_trip_with_provenance(db_url):
    before = datetime.now(UTC)
    with Store(db_url) as store:
        run_id = store.create_run("nightly-h200", "harness/configs/nightly.yaml", META, trigger="nightly")
        got = store.run(run_id)
        assert got.provenance == META
        assert (got.id, got.name, got.matrix) == (run_id, "nightly-h200", "harness/configs/nightly.yaml")
        assert (got.trigger, got.status, got.finished_at) == ("nightly", "running", None)
        assert got.started_at.tzinfo == UTC and before - timedelta(seconds=1) <= got.started_at
        store.finish_run(run_id)
        done = store.run(run_id)
        assert done.status == "finished" and done.finished_at.tzinfo == UTC
        assert done.started_at == got.started_at <= done.finished_at <= datetime.now(UTC)


def test_missing_provenance_is_null_and_unknown_is_refused(db_url):
    with Store(db_url) as store:
        run = store.run(store.create_run("cpu", "smoke.yaml", {"host": "laptop"}))
        assert run.host == "laptop" and run.gpu_name is None and run.trigger == "manual"
        with pytest.raises(ValueError, match="gpu_nmae"):
            store.create_run("cpu", "smoke.yaml", {"gpu_nmae": "x"})


def test_record_commits_immediately_and_replaces(db_url, axes):
    first = Store(db_url)
    run_id = first.create_run("r", "smoke.yaml", META)
    first.record_result(run_id, row(axes, status="fail_run", reason="segfault", log="boom"))
    with Store(db_url) as second:  # first is still open: the row must already be committed
        [seen] = second.results(run_id)
        assert (seen.status, seen.reason, seen.log) == ("fail_run", "segfault", "boom")
        assert seen == row(axes, status="fail_run", reason="segfault", log="boom")
        first.record_result(run_id, row(axes, status="pass", metrics=CellMetrics(speedup={8: 2.0})))
        [replaced] = second.results(run_id, all_attempts=True)
        assert (replaced.status, replaced.reason, replaced.metrics.latency.speedup) == ("pass", "", {8: 2.0})
    first.close()


def test_final_attempt_per_key_in_first_recorded_order(db_url, axes):
    with Store(db_url) as store:
        run_id = store.create_run("r", "smoke.yaml", META)
        store.record_result(run_id, row(axes, "a", "timeout", attempt=1))
        store.record_result(run_id, row(axes, "b", "pass", attempt=1))
        store.record_result(run_id, row(axes, "a", "pass_flaky", attempt=2))
        latest = store.results(run_id)
        assert [(r.key, r.attempt, r.status) for r in latest] == [("a", 2, "pass_flaky"), ("b", 1, "pass")]
        every = store.results(run_id, all_attempts=True)
        assert [(r.key, r.attempt) for r in every] == [("a", 1), ("b", 1), ("a", 2)]


def test_final_states_are_the_highest_attempts_without_logs(db_url, axes):
    with Store(db_url) as store:
        run_id, other = store.create_run("r", "m.yaml", META), store.create_run("r2", "m.yaml", META)
        assert store.final_states(run_id) == {}
        store.record_result(run_id, row(axes, "a", "fail_capture", attempt=1, reason="first", log="x" * 1000))
        store.record_result(run_id, row(axes, "b", "unsupported"))
        store.record_result(run_id, row(axes, "a", "pass_flaky", attempt=2, reason="second"))
        store.record_result(other, row(axes, "c"))
        states = store.final_states(run_id)
        assert list(states) == ["a", "b"]
        assert states["a"] == {"key": "a", "axes": axes, "status": "pass_flaky", "reason": "second", "attempt": 2}
        assert list(store.final_states(other)) == ["c"]
        with pytest.raises(KeyError, match=f"no run {other + 1}"):
            store.final_states(other + 1)


def test_latest_run_filters(db_url):
    with Store(db_url) as store:
        assert store.latest_run() is None
        a = store.create_run("nightly", "nightly.yaml", META, trigger="nightly")
        b = store.create_run("nightly", "smoke.yaml", META)
        c = store.create_run("adhoc", "nightly.yaml", META)
        d = store.create_run("nightly", "nightly.yaml", META)
        assert store.latest_run().id == d
        assert store.latest_run(name="adhoc").id == c
        assert store.latest_run(matrix="smoke.yaml").id == b
        assert store.latest_run(name="nightly", matrix="nightly.yaml").id == d
        assert store.latest_run(trigger="nightly").id == a
        assert store.latest_run(name="adhoc", trigger="nightly") is None
        assert store.latest_run(name="nope") is None


def test_run_refs_and_listing(db_url):
    with Store(db_url) as store:
        with pytest.raises(KeyError, match="no runs .* yet"):
            store.run("latest")
        ids = [store.create_run(f"r{i}", "m.yaml", META) for i in range(3)]
        assert store.run("latest").id == ids[-1] == store.run(str(ids[-1])).id
        assert [r.id for r in store.runs()] == ids[::-1]
        assert [r.id for r in store.runs(limit=2)] == ids[:0:-1]
        night = store.create_run("r1", "/elsewhere/m.yaml", META, trigger="nightly")  # another checkout's path
        assert [r.id for r in store.runs(name="r1")] == [night, ids[1]]
        assert [r.id for r in store.runs(name="r1", trigger="nightly")] == [night]
        assert store.runs(name="r1", trigger="manual", limit=1)[0].id == ids[1]
        ids.append(night)
        with pytest.raises(KeyError) as missing:
            store.run(ids[-1] + 100)
        assert str(missing.value) == f"no run {ids[-1] + 100} in {store.url}; the newest is run {ids[-1]}"
        with pytest.raises(RunNotFound, match="give a run id or 'latest'"):
            store.run("newest")
        with pytest.raises(KeyError):
            store.results(ids[-1] + 100)
        with pytest.raises(KeyError):
            store.finish_run(ids[-1] + 100)


def test_record_results_writes_all_rows_in_one_transaction_or_none(db_url, axes):
    with Store(db_url) as store:
        run_id = store.create_run("r", "m.yaml", META)
        rows = [row(axes, f"cell-{i}", metrics=CellMetrics(pieces=i)) for i in range(500)]
        commits: list[object] = []

        def count(conn) -> None:
            commits.append(conn)

        event.listen(Engine, "commit", count)
        try:
            store.record_results(run_id, rows + [row(axes, "cell-0", status="fail_run", reason="given twice: last wins")])
        finally:
            event.remove(Engine, "commit", count)
        assert len(commits) == 1  # one transaction for the whole batch
        got = {r.key: r for r in store.results(run_id)}
        assert len(got) == 500 and got["cell-7"].metrics.capture.pieces == 7
        assert (got["cell-0"].status, got["cell-0"].reason) == ("fail_run", "given twice: last wins")
        store.record_results(run_id, [row(axes, "cell-1", status="timeout"), row(axes, "new")])  # replaces, adds
        got = {r.key: r for r in store.results(run_id)}
        assert len(got) == 501 and got["cell-1"].status == "timeout"
        bad: Any = {"key": "bad", "axes": axes, "status": "pass"}
        with pytest.raises(TypeError, match="CellRecord, not dict"):  # one bad row: nothing of the batch is written
            store.record_results(run_id, [row(axes, "cell-2", status="fail_run"), bad])
        got = {r.key: r for r in store.results(run_id)}
        assert "bad" not in got and got["cell-2"].status == "pass"
        with pytest.raises(KeyError, match=f"no run {run_id + 1}"):
            store.record_results(run_id + 1, [row(axes)])
        with pytest.raises(KeyError, match=f"no run {run_id + 1}"):
            store.record_results(run_id + 1, [])


def test_import_run_keeps_its_times_in_one_transaction(db_url, axes):
    start = datetime(2026, 2, 1, 10, tzinfo=UTC)
    with Store(db_url) as store:
        records = [row(axes, "a", "fail_run"), row(axes, "a", "pass_flaky", attempt=2), row(axes, "b")]
        run_id = store.import_run("up", "m.yaml", META, records, trigger="ci", status="interrupted",
                                  started_at=start, finished_at=start + timedelta(minutes=30))
        run = store.run(run_id)
        assert (run.trigger, run.status, run.host) == ("ci", "interrupted", META["host"])
        assert (run.started_at, run.finished_at) == (start, start + timedelta(minutes=30))
        assert [(r.key, r.attempt) for r in store.results(run_id)] == [("a", 2), ("b", 1)]
        running = store.run(store.import_run("live", "m.yaml", {}, [], status="running"))
        assert running.status == "running" and running.finished_at is None
        with pytest.raises(ValueError, match="no finish time"):
            store.import_run("live", "m.yaml", {}, [], status="running", finished_at=start)
        with pytest.raises(ValueError, match="unknown provenance keys"):
            store.import_run("bad", "m.yaml", {"gpu": "x"}, records)
        with pytest.raises(TypeError):
            store.import_run("bad", "m.yaml", {}, [*records, {"key": "c"}])
        assert [r.name for r in store.runs()] == ["live", "up"]  # the failed imports left no run behind


def test_record_for_missing_run_or_not_a_record(db_url, axes):
    with Store(db_url) as store:
        run_id = store.create_run("r", "m.yaml", META)
        with pytest.raises(KeyError, match=f"no run {run_id + 1}"):
            store.record_result(run_id + 1, row(axes))
        with pytest.raises(TypeError, match="CellRecord, not dict"):
            store.record_result(run_id, dict(row(axes)))  # type: ignore[arg-type]
        assert store.results(run_id) == []


def test_metrics_round_trip_exactly(db_url, axes):
    metrics = CellMetrics(
        device="cuda", dtype="bfloat16", layers=4, tiny=False, max_tokens=512,
        latency_ms={8: {"eager": 31.25, "graph": 5.0}, 32: {"eager": 0.1 + 0.2, "graph": 1e-300}},
        speedup={8: 6.25, 32: None}, bucket_hits={8: 3}, token_match=1.0, graph_pool_bytes=2**40,
        topk_containment_ok=True, eager_bitwise_deterministic=False,
        eager_self_diff={"token_match": 1.0, "max_prompt_logprob_diff": -0.0},
        divergences=["ünïcode ✓ \u0000 kept in JSON"], max_prompt_logprob_diff=float("nan"),
        max_output_logprob_diff=float("inf"), max_prompt_kl=float("-inf"))
    with Store(db_url) as store:
        run_id = store.create_run("r", "m.yaml", META)
        store.record_result(run_id, row(axes, metrics=metrics))
    with Store(db_url) as store:
        got = store.results(run_id)[0].metrics
    assert math.isnan(got.judge.max_prompt_logprob_diff)
    # repr: floats bit-exact, -0.0 kept, ints stay ints, token counts stay ints
    assert repr(got.model_copy(update={"max_prompt_logprob_diff": None})) == repr(
        metrics.model_copy(update={"max_prompt_logprob_diff": None}))


def test_rows_written_before_cell_metrics_read_back(db_url, axes):
    """Older rows keep the axes and duration in metrics and token counts as strings: still CellRecords."""
    old = {"model": "qwen3-0.6b", "graph": "piecewise", "duration_s": 9.0, "device": "cpu",
           "speedup": {"8": 2.5, "32": "NaN"}, "latency_ms": {"8": {"eager": 10.0, "graph": 4.0}},
           "bucket_hits": {"8": 2}, "graph_pool_bytes": 1024.0}
    with Store(db_url) as store:
        run_id = store.create_run("r", "m.yaml", META)
        with store._engine.begin() as conn:  # as an older Store wrote it
            conn.execute(CellResult.__table__.insert(), [{"run_id": run_id, "key": "k", "axes": axes, "status": "pass",
                                                          "reason": "", "metrics": old, "log": "", "duration_s": 9.0,
                                                          "attempt": 1}])
        [got] = store.results(run_id)
        [cell] = store.views.cells(run_id, latency=True)
    for m in (got.metrics, cell.metrics):
        assert m.latency.speedup[8] == 2.5 and math.isnan(m.latency.speedup[32]) and m.latency.latency_ms[8].graph == 4.0
    assert got.metrics.settings.device == "cpu" and got.metrics.capture.bucket_hits == {8: 2} and got.metrics.capture.graph_pool_bytes == 1024


def test_text_columns_take_nul_bytes_and_surrogates(db_url, axes):
    with Store(db_url) as store:
        run_id = store.create_run("r", "m.yaml", META)
        store.record_result(run_id, row(axes, log="before\x00after \udcff end", reason="why\x00"))
        got = store.results(run_id)[0]
        assert got.log == "before\ufffdafter ? end" and got.reason == "why\ufffd"


def test_two_stores_interleaved_on_one_run(db_url, axes):
    with Store(db_url) as a, Store(db_url) as b:
        run_id = a.create_run("r", "m.yaml", META)
        for i in range(10):
            (a if i % 2 == 0 else b).record_result(run_id, row(axes, f"cell-{i}", duration_s=float(i)))
            assert _keys(a, run_id) == _keys(b, run_id) == {f"cell-{j}" for j in range(i + 1)}
        errors: list[BaseException] = []

        def worker(store: Store, prefix: str) -> None:
            try:
                for i in range(25):
                    store.record_result(run_id, row(axes, f"{prefix}-{i}"))
            except BaseException as e:  # noqa: BLE001 - surfaced by the assert below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(s, p)) for s, p in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(b.results(run_id)) == 60 and len(_keys(a, run_id)) == 60


@pytest.mark.parametrize(
    "url, says",
    [
        ("nosuchdb://user:s3cret@host/db", "not supported"),
        ("mysql://user:s3cret@host/db", "not supported"),
        ("postgresql+psycopg://user:s3cret@host:notaport/db", "cannot be parsed"),
        ("postgresql+psycopg://user:s3cret@127.0.0.1:1/db", "cannot open the results database"),
    ],
)
def test_bad_url_is_a_config_error_with_the_password_masked(url, says):
    with pytest.raises(ConfigError) as err:
        Store(url)
    msg = str(err.value)
    assert says in msg and "s3cret" not in msg and "user:***@" in msg, msg
    assert "sqlite:///path/to/pcg.db" in msg and "PCG_DB_URL" in msg, msg  # the fix is named


def test_unwritable_sqlite_path_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create its directory"):
        Store(str(blocker / "sub" / "pcg.db"))
    with pytest.raises(ConfigError, match="is a folder"):
        Store(str(tmp_path))  # a directory is not a database file


def test_default_url_and_plain_paths(tmp_path, monkeypatch, axes):
    monkeypatch.delenv("PCG_DB_URL", raising=False)
    assert default_db_url() == "sqlite:///pcg.db"
    monkeypatch.chdir(tmp_path)
    with Store() as store:  # relative to the cwd at open, even after a chdir
        run_id = store.create_run("r", "m.yaml", {})
        monkeypatch.chdir("/")
        store.record_result(run_id, row(axes))
    assert (tmp_path / "pcg.db").is_file()
    path = tmp_path / "nested" / "dir" / "plain.db"
    monkeypatch.setenv("PCG_DB_URL", str(path))
    assert default_db_url() == str(path)
    with Store() as store:
        store.create_run("r", "m.yaml", {})
    with Store(f"sqlite:///{path}") as store:
        assert store.run("latest").name == "r"


def test_runs_of_a_matrix_by_its_spellings_with_the_files_hash(tmp_path):
    with Store(str(tmp_path / "r.db")) as store:
        old = store.create_run("nightly", "m.yaml", META)  # recorded without a hash (an older pcgh)
        new = store.create_run("nightly", "/abs/m.yaml", META, matrix_sha256="0" * 64)
        found = store.runs_of_matrix("nightly", ["/abs/m.yaml", "m.yaml"])
        assert [(r.id, r.matrix_sha256) for r in found] == [(new, "0" * 64), (old, None)]
        assert store.runs_of_matrix("other", ["m.yaml"]) == []
        assert store.run(new).matrix_sha256 is None  # a run's own row: the hash is runs_of_matrix's to join in
