"""Store.views, the dashboard's wide reads, on SQLite and PostgreSQL: the Store's final-attempt rule, no logs,
only the shown metrics, and the same records Store.results gives for what they share."""

from __future__ import annotations

from collections import Counter

from harness.metrics import CellMetrics, Latency
from harness.outcome import CellRecord
from harness.store import Store
from harness.store.views import REASON_CHARS

FULL = CellMetrics(device="cpu", capture_s=1.5, graph_pool_bytes=2**20, token_match=0.75, pieces=9,
                   speedup={8: 2.0, 32: 3.0}, latency_ms={8: Latency(eager=10.0, graph=5.0)})


def _axes(model: str, graph: str = "full") -> dict[str, str]:
    return {"model": model, "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": graph, "compiler": "eager"}


def _seed(store: Store) -> tuple[int, int]:
    first = store.create_run("r", "m.yaml", {})
    store.record_results(first, [CellRecord(key="a", axes=_axes("m:tiny"), status="pass", metrics=FULL, log="A")])
    run = store.create_run("r", "m.yaml", {})
    store.record_results(run, [
        CellRecord(key="a", axes=_axes("m:tiny"), status="fail_run", reason="x" * 1000, log="first"),
        CellRecord(key="b", axes=_axes("n:trim:4"), status="unsupported"),
        CellRecord(key="a", axes=_axes("m:tiny"), status="pass_flaky", attempt=2, metrics=FULL, log="second"),
        CellRecord(key="c", axes=_axes("m:tiny", "piecewise"), status="timeout", reason="y" * 1000),
    ])
    return first, run


def test_cells_are_the_final_attempts_without_logs_and_with_the_shown_metrics(db_url):
    with Store(db_url) as store:
        _, run = _seed(store)
        cells = store.views.cells(run)
        assert [(c.key, c.attempt, c.status) for c in cells] == [("a", 2, "pass_flaky"), ("b", 1, "unsupported"),
                                                                  ("c", 1, "timeout")]
        assert all(c.log == "" for c in cells) and cells[2].reason == "y" * REASON_CHARS
        shown = CellMetrics(capture_s=1.5, graph_pool_bytes=2**20, token_match=0.75, speedup={8: 2.0, 32: 3.0})
        assert cells[0].metrics == shown and cells[1].metrics == CellMetrics()
        assert store.views.cells(run, latency=True)[0].metrics == shown.model_copy(update={"latency": shown.latency.model_copy(update={"latency_ms": FULL.latency.latency_ms})})
        full = store.results(run)
        assert [c.model_copy(update={"metrics": CellMetrics(), "reason": ""}) for c in cells] == [
            r.model_copy(update={"metrics": CellMetrics(), "reason": "", "log": ""}) for r in full]


def test_counts_history_log_and_previous_run(db_url):
    with Store(db_url) as store:
        first, run = _seed(store)
        assert store.views.status_counts([first, run, run + 1]) == {
            first: Counter({"pass": 1}),
            run: Counter({"pass_flaky": 1, "unsupported": 1, "timeout": 1}), run + 1: Counter()}
        assert store.views.model_counts(run) == {"m:tiny": Counter({"pass_flaky": 1, "timeout": 1}),
                                                 "n:trim:4": Counter({"unsupported": 1})}
        history = store.views.history("a")
        assert [(h.run_id, h.attempts, h.record.status) for h in history] == [(first, 1, "pass"), (run, 2, "pass_flaky")]
        assert history[1].record.metrics == FULL and history[1].record.log == "" and history[0].run_name == "r"
        assert store.views.history("nope") == []
        assert (store.views.log(run, "a"), store.views.log(run, "nope")) == ("second", "")
        assert (store.views.previous_run_id(run), store.views.previous_run_id(first)) == (first, None)


def _plan(store: Store, order) -> list[str]:
    from sqlalchemy import select

    from harness.store.models import CellResult, final_attempt

    q = select(CellResult.key).where(CellResult.run_id == 1, final_attempt()).order_by(order)
    sql = str(q.compile(store._engine, compile_kwargs={"literal_binds": True}))  # noqa: SLF001
    with store._engine.connect() as conn:  # noqa: SLF001
        return [row[3] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]


def test_the_final_attempt_rules_are_answered_by_the_unique_index(tmp_path) -> None:
    """Both correlated subqueries of a run's cells (a later attempt exists? where was the key first recorded?)
    must be index searches on (run_id, key): planned over the run_id index instead, the 10,000-cell matrix of a
    300,000-row store took 46 s (benchmarks/results/2026-12-01-cpu)."""
    from sqlalchemy import func, select
    from sqlalchemy.orm import aliased

    from harness.store.models import CellResult, first_recorded

    with Store(f"sqlite:///{tmp_path / 'p.db'}") as store:
        subqueries = [line for line in _plan(store, first_recorded()) if line.startswith(("SEARCH cell_results_", "SCAN cell_results_"))]
        assert len(subqueries) == 2 and all("(run_id=? AND key=?" in line for line in subqueries), subqueries
        first = aliased(CellResult)  # the old form, min(id): not answered by that index
        old = select(func.min(first.id)).where(first.run_id == CellResult.run_id, first.key == CellResult.key)
        planted = [line for line in _plan(store, old.scalar_subquery()) if line.startswith(("SEARCH cell_results_", "SCAN cell_results_"))]
        assert not all("(run_id=? AND key=?" in line for line in planted), planted


def test_precounted_statuses_follow_every_write_and_revisions_count_them(db_url):
    with Store(db_url) as store:
        first, run = _seed(store)
        revs = store.views.revisions([first, run])
        version = store.views.version()
        store.record_result(run, CellRecord(key="c", axes=_axes("m:tiny", "piecewise"), status="pass", attempt=2))
        assert store.views.status_counts([run])[run] == Counter({"pass_flaky": 1, "unsupported": 1, "pass": 1})
        store.record_result(run, CellRecord(key="b", axes=_axes("n:trim:4"), status="skipped"))  # replaced in place
        assert store.views.status_counts([run])[run] == Counter({"pass_flaky": 1, "skipped": 1, "pass": 1})
        assert store.views.revisions([first, run, run + 1]) == {first: revs[first], run: revs[run] + 2, run + 1: 0}
        store.finish_run(first)  # the run's own row changed: its revision too
        assert store.views.revisions([first])[first] == revs[first] + 1
        assert store.views.version() != version
        assert store.views.statuses(run) == {"a": "pass_flaky", "b": "skipped", "c": "pass"}


def test_a_database_from_before_the_counts_is_counted_when_opened(tmp_path):
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with Store(url) as store:
        first, run = _seed(store)
        expected = store.views.status_counts([first, run])
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE run_counts"))  # as a database made before the table existed
    engine.dispose()
    with Store(url) as store:
        assert store.views.status_counts([first, run]) == expected
        assert store.views.revisions([first, run]) == {first: 1, run: 1}
    engine = create_engine(url)
    with engine.begin() as conn:  # a run written by an older Store after that: counted where read
        conn.execute(text("DELETE FROM run_counts WHERE run_id = :r"), {"r": run})
    engine.dispose()
    with Store(url) as store:
        assert store.views.status_counts([run]) == {run: expected[run]}


def test_a_run_stored_under_a_schemes_old_name_still_reads_and_joins_its_history(db_url):
    """NVFP4 was the quant value `fp4` before the scheme registry: such a stored cell reads as it was stored (old
    reports stay byte for byte), and a cell's history finds it under either spelling."""
    from harness.outcome import cell_key

    old_axes, new_axes = {**_axes("m:tiny"), "quant": "fp4"}, {**_axes("m:tiny"), "quant": "nvfp4"}
    with Store(db_url) as store:
        first = store.create_run("r", "m.yaml", {})
        store.record_results(first, [CellRecord(key=cell_key(old_axes), axes=old_axes, status="pass", metrics=FULL)])
        run = store.create_run("r", "m.yaml", {})
        store.record_results(run, [CellRecord(key=cell_key(new_axes), axes=new_axes, status="fail_run")])
        old = store.results(first)[0]
        assert old.axes["quant"] == "fp4" and old.key == cell_key(old_axes)
        history = store.views.history(cell_key(new_axes))
        assert [(h.run_id, h.record.status) for h in history] == [(first, "pass"), (run, "fail_run")]
        assert store.views.history(cell_key({**_axes("m:tiny"), "quant": "awq"})) == []


def _counting(value):
    calls = []

    def build():
        calls.append(1)
        return value

    return build, calls


def test_a_stored_aggregate_is_built_once_per_revision_and_read_back_by_another_process(db_url):
    from pydantic import TypeAdapter

    adapter = TypeAdapter(dict[str, int])
    with Store(db_url) as store:
        _, run = _seed(store)
        build, calls = _counting({"x": 1})
        assert store.views.stored("probe", run, adapter, build) == {"x": 1} and calls == [1]
        store.views.flush()
    with Store(db_url) as again:  # a restarted server: the kept row, not a build
        build, calls = _counting({"x": 2})
        assert again.views.stored("probe", run, adapter, build) == {"x": 1} and calls == []
        again.record_results(run, [CellRecord(key="d", axes=_axes("m:tiny", "breakable"), status="pass")])
        assert again.views.stored("probe", run, adapter, build) == {"x": 2} and calls == [1]  # a write: built again
        again.views.flush()
        assert again.views.stored("probe", run, adapter, build) == {"x": 2} and calls == [1]
    with Store(db_url, read_only=True) as reader:
        assert reader.views.stored("probe", run, adapter, _counting({"x": 3})[0]) == {"x": 2}


def test_a_kept_aggregate_that_no_longer_reads_as_its_type_is_built_again(db_url):
    from pydantic import TypeAdapter

    with Store(db_url) as store:
        _, run = _seed(store)
        store.views.stored("probe", run, TypeAdapter(dict[str, str]), lambda: {"x": "not a number"})
        store.views.flush()
        build, calls = _counting({"x": 5})
        assert store.views.stored("probe", run, TypeAdapter(dict[str, int]), build) == {"x": 5} and calls == [1]


def test_history_strips_read_the_kept_statuses(db_url):
    with Store(db_url) as store:
        first, run = _seed(store)
        want = store.views.statuses(run)
        assert want == {"a": "pass_flaky", "b": "unsupported", "c": "timeout"}
        store.views.flush()
    with Store(db_url) as again:
        from sqlalchemy import text

        with again.views.engine.begin() as conn:  # the cells gone behind the store's back: only the kept row answers
            conn.execute(text("DELETE FROM cell_results"))
        assert again.views.statuses(run) == want
