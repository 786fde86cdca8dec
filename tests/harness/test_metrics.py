"""CellMetrics grouped by producer: every metric in exactly one group, rows stored flat before the groups read into
them, a grouped value winning over a stale flat one, a bad value dropped where it sits (flat or grouped), and the
dashboard's SQL finding a shown metric in either shape of row."""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from harness.metrics import GROUP_OF, GROUPS, CellMetrics
from harness.outcome import AXES, CellRecord
from harness.store import Store
from harness.store.models import CellResult

AXES_OF = {a: ("m:tiny" if a == "model" else "x") for a in AXES} | {"kv_cache": "auto"}
FLAT = {"device": "cuda", "layers": 4, "token_match": 0.75, "capture_s": 1.5, "graph_pool_bytes": 2**20,
        "quant_layers": 7, "weights_bytes": 10, "speedup": {"8": 2.0}, "latency_ms": {"8": {"eager": 4.0, "graph": 2.0}},
        "rank_statuses": ["pass", "pass"], "reference": {"status": "pass"}, "tp1_logprob_diff": 1e-6,
        "coverage": {"buckets": 3}, "duration_s": 9.0}


def test_every_metric_lives_in_exactly_one_group():
    names = [n for cls in GROUPS.values() for n in cls.model_fields]
    assert len(names) == len(set(names))
    assert set(GROUP_OF) == {*names, "duration_s"}  # duration_s: cell_s's name in the oldest rows
    assert set(CellMetrics.model_fields) == {*GROUPS, "coverage"}


def test_a_flat_row_reads_into_its_groups_and_dumps_grouped():
    m = CellMetrics.model_validate(FLAT)
    assert (m.settings.device, m.settings.layers, m.judge.token_match, m.capture.capture_s) == ("cuda", 4, 0.75, 1.5)
    assert m.quant.quant_layers == 7 and m.memory.weights_bytes == 10 and m.latency.speedup == {8: 2.0}
    assert m.latency.graph_latencies() == {8: 2.0} and m.process.rank_statuses == ["pass", "pass"]
    assert m.judge.reference.status == "pass" and m.judge.tp1_logprob_diff == 1e-6 and m.coverage.buckets == 3
    assert m.process.cell_s == 9.0 and m.value("graph_pool_bytes") == 2**20
    dumped = m.model_dump(mode="python", exclude_defaults=True)
    assert set(dumped) == {"settings", "judge", "capture", "quant", "memory", "latency", "process", "coverage"}
    assert CellMetrics.model_validate(dumped) == m  # the grouped form reads back the same
    assert m.measured()["token_match"] == 0.75 and "judge" not in m.measured()


def test_a_grouped_value_wins_over_a_flat_one_of_the_same_name():
    m = CellMetrics.model_validate({"token_match": 0.1, "judge": {"token_match": 0.9}, "pieces": 3})
    assert m.judge.token_match == 0.9 and m.capture.pieces == 3


@pytest.mark.parametrize("row", [
    {"token_match": "high", "pieces": 3},  # flat
    {"judge": {"token_match": "high"}, "capture": {"pieces": 3}},  # grouped
    {"judge": "not a group", "pieces": 3},  # a group of the wrong shape
])
def test_lenient_drops_a_bad_value_where_it_sits_and_keeps_the_rest(row):
    m = CellMetrics.lenient(row)
    assert m.judge.token_match is None and m.capture.pieces == 3


def test_the_dashboards_sql_reads_shown_metrics_from_flat_and_grouped_rows(db_url):
    grouped = CellMetrics.model_validate(FLAT).model_dump(mode="python", exclude_defaults=True)
    with Store(db_url) as store:
        run = store.create_run("r", "m.yaml", {})
        store.record_results(run, [CellRecord(key="grouped", axes=AXES_OF, status="pass",
                                              metrics=CellMetrics.model_validate(grouped))])
        with store._engine.begin() as conn:  # noqa: SLF001 - a row as a version before the groups wrote it
            conn.execute(insert(CellResult).values(run_id=run, key="flat", axes=AXES_OF, status="pass", reason="",
                                                   metrics=FLAT, duration_s=1.0, attempt=1))
        cells = {c.key: c.metrics for c in store.views.cells(run, latency=True)}
    for key in ("grouped", "flat"):
        m = cells[key]
        assert (m.capture.capture_s, m.capture.graph_pool_bytes, m.judge.token_match) == (1.5, 2**20, 0.75), key
        assert m.latency.speedup == {8: 2.0} and m.latency.latency_ms[8].graph == 2.0, key
        assert m.quant.quant_layers is None  # not a shown metric: the page's query leaves it out
