"""The matrix page answers first: coverage beside the pass rate, support by axis with reasons grouped, unsupported
cells hidden on request, multi-select filters, pages of models, TestGrid history strips with flipped, flaky and
slower cells marked. And the pages a write makes stale are never served from the cache."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient
from web_seed import axes, key, metrics, seed

from harness.metrics import CellMetrics, Latency
from harness.outcome import CellRecord
from harness.store import Store
from web import grid as grid_module
from web.app import create_app
from web.grid import build_grid
from web.support import reason_key, support


def text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", "", html).split())


def _nightly(url: str, statuses: dict[str, str], name: str = "nightly") -> int:
    """One more run of `name` holding only these cells (key → status)."""
    with Store(url) as store:
        records = [CellRecord(key=k, axes=dict(p.split("=", 1) for p in k.split("|")), status=s,
                              reason="prompt logprob diff 0.31 > 0.001" if s == "fail_accuracy" else "")
                   for k, s in statuses.items()]
        return store.import_run(name, "m.yaml", {}, records, trigger="nightly")


def test_support_summary_counts_every_axis_value_and_groups_reasons(sqlite_client: TestClient) -> None:
    html = sqlite_client.get("/?run=3").text
    by_model = re.search(r'id="support-model">(.*?)</table>', html, re.DOTALL).group(1)
    rows = {m: tuple(int(n) for n in re.findall(r'<td class="num[^"]*">(\d+)</td>', r))
            for m, r in re.findall(r'<tr><td><a href="[^"]+">([^<]+)</a></td>(.*?)</tr>', by_model, re.DOTALL)}
    # run 3: llama has 2 unsupported full cells and a pass_flaky; qwen3-8b an eager_fail and a timeout
    assert rows == {"llama-3.1-8b:tiny": (4, 0, 2), "mixtral-8x7b:tiny": (5, 1, 0), "qwen3-0.6b:tiny": (6, 0, 0),
                    "qwen3-8b:trim:4": (4, 1, 0)}
    reasons = re.search(r'id="unsupported-reasons">(.*?)</table>', html, re.DOTALL).group(1)
    assert "full graph: sliding-window attention is not supported" in reasons
    # the group links to exactly its cells: the axes they share, the statuses they have, and shown
    href = re.search(r'<td class="num"><a href="([^"]+)">2</a>', reasons).group(1).replace("&amp;", "&")
    q = parse_qs(urlparse(href).query)
    assert q["model"] == ["llama-3.1-8b:tiny"] and q["graph"] == ["full"] and q["status"] == ["unsupported"]
    assert "attention" not in q and "quant" not in q  # two attentions; one quant in the whole run says nothing
    linked = sqlite_client.get(href).text
    assert "2 of 24 cells shown" in text(linked) and len(re.findall(r'<td class="s-not_run', linked)) == 2
    failing = re.search(r'id="failing-reasons">(.*?)</table>', html, re.DOTALL).group(1)
    assert "RuntimeError: capture failed in piece 3" in failing and "no result after 300 s" in failing


def test_reasons_that_differ_only_in_numbers_group_together() -> None:
    assert reason_key("needs 2 CUDA GPU(s), 1 visible") == reason_key("needs 8 CUDA GPU(s), 0 visible")
    assert reason_key("quantization 'fp8' is not supported") != reason_key("quantization 'awq' is not supported")
    rows = [CellRecord(key=f"k{i}", axes=axes("m:tiny", g), status="unsupported", reason=f"needs {i} GPUs\nmore")
            for i, g in ((2, "full"), (4, "full"), (8, "piecewise"))]
    s = support(rows, 1)
    assert [(g.cells, g.shared) for g in s.not_supported] == [(3, {})] and s.not_supported[0].reason == "needs 2 GPUs…"
    assert (s.tally.total, s.tally.launched, s.tally.pass_rate) == (3, 0, None)


def test_unsupported_cells_are_hidden_by_default_and_shown_on_request(sqlite_client: TestClient) -> None:
    hidden, shown = sqlite_client.get("/").text, sqlite_client.get("/?unsupported=show").text
    assert "22 of 24 cells shown (2 not supported hidden)" in text(hidden)
    assert 'class="s-not_run' not in hidden and len(re.findall(r'<td class="s-not_run', shown)) == 2
    assert re.search(r'<select name="unsupported"[^>]*>\s*<option value="hide">hide</option>\s*'
                     r'<option value="show" selected>show</option>', shown)
    only = sqlite_client.get("/?status=unsupported").text  # everything asked for is hidden: say so, link them
    assert 'id="all-hidden"' in only and "unsupported=show" in re.search(r'id="all-hidden">.*?</p>', only, re.DOTALL).group(0)
    assert sqlite_client.get("/?unsupported=maybe").status_code == 422


def test_filters_take_several_values_and_the_form_keeps_them(sqlite_client: TestClient) -> None:
    html = sqlite_client.get("/?graph=full&graph=breakable&model=qwen3-*&unsupported=show").text
    form = re.search(r'<select name="graph" multiple[^>]*>(.*?)</select>', html, re.DOTALL).group(1)
    assert re.findall(r"<option selected>(\w+)</option>", form) == ["breakable", "full"]
    assert "<option selected>qwen3-*</option>" in html  # a glob typed in the URL stays in the form
    assert "8 of 24 cells shown" in text(html)  # 2 qwen3 models × 2 graphs × 2 attentions


def test_pages_hold_whole_models(sqlite_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grid_module, "PAGE_CELLS", 11)  # 6 cells a model: one model a page... or two
    first = sqlite_client.get("/?unsupported=show&group=attention").text
    assert re.findall(r'<th class="model" scope="row">([^<]+)</th>', first) == ["llama-3.1-8b:tiny"]
    assert "models 1–1 of 4" in text(first)
    nxt = re.search(r'<a href="([^"]+)" rel="next">', first).group(1).replace("&amp;", "&")
    assert parse_qs(urlparse(nxt).query) == {"unsupported": ["show"], "group": ["attention"], "page": ["2"]}
    second = sqlite_client.get(nxt).text
    assert re.findall(r'<th class="model" scope="row">([^<]+)</th>', second) == ["mixtral-8x7b:tiny"]
    last = sqlite_client.get("/?unsupported=show&page=99").text  # past the end: the last page
    assert re.findall(r'<th class="model" scope="row">([^<]+)</th>', last) == ["qwen3-8b:trim:4"]
    rows = [CellRecord(key=f"{m}{i}", axes=axes(m, g), status="pass") for m in "abc" for i, g in enumerate(("full", "piecewise"))]
    g = build_grid(rows, 1, page=2, per_page=4)
    assert (g.pages, g.page, g.first_model, [m for m, _ in g.rows]) == (2, 2, 2, ["c"])
    assert len(build_grid(rows, 1, page=None, per_page=1).rows) == 3  # no page: every model (the API)


def test_history_strips_mark_flipped_and_flaky_cells(tmp_path: Path) -> None:
    seeded = seed(f"sqlite:///{tmp_path / 'pcg.db'}")
    flaky, steady = key("qwen3-0.6b:tiny", "breakable"), key("qwen3-0.6b:tiny", "piecewise")
    run4 = _nightly(seeded.url, {flaky: "pass", steady: "pass"})  # nightly: runs 1, 2, 4
    with TestClient(create_app(seeded.url)) as c:
        html = c.get(f"/?run={run4}").text
    strips = {k.replace("%7C", "|"): (css, s) for css, k, s in
              re.findall(r'<td class="([^"]+)"><a href="/cell\?key=([^&]+)&amp;run=\d+"[^>]*>[^<]*'
                         r'<span class="strip">(.*?)</span>', html)}
    assert strips[flaky] == ("s-pass flip flaky", '<i class="p"></i><i class="f"></i><i class="p"></i>')
    assert strips[steady] == ("s-pass", '<i class="p"></i><i class="p"></i><i class="p"></i>')
    assert "its status in runs #1 #2 and this one" in text(html)


def test_a_pass_slower_than_eager_is_marked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pcg.db'}"
    slow = CellMetrics(speedup={8: 0.49}, latency_ms={8: Latency(eager=1.0, graph=2.04)})
    with Store(url) as store:
        store.import_run("r", "m.yaml", {}, [CellRecord(key="k", axes=axes("m:tiny", "full"), status="pass", metrics=slow)])
    with TestClient(create_app(url)) as c:
        html, cell = c.get("/").text, c.get("/cell?key=k").text
    assert re.search(r'<td class="s-pass slower"><a [^>]*>0\.49×</a>', html)
    latency = re.search(r'id="latency">(.*?)</table>', cell, re.DOTALL).group(1)
    assert "2.040" in latency and '<td class="num worse">0.49×</td>' in latency


def test_a_write_is_never_hidden_by_a_kept_page(tmp_path: Path) -> None:
    seeded = seed(f"sqlite:///{tmp_path / 'pcg.db'}")
    mixtral = key("mixtral-8x7b:tiny", "full")
    with TestClient(create_app(seeded.url)) as c:
        urls = ("/", "/runs", f"/runs/{seeded.latest}", f"/cell?key={mixtral}", "/diff", "/api/matrix")
        before = {u: c.get(u).text for u in urls}
        assert all(c.get(u).text == before[u] for u in urls)  # kept: the same page
        assert c.app.state.pages.hits == 5  # every URL above but the API's, which builds its answer each time
        with Store(seeded.url) as store:  # the cell is retried in another process and passes
            store.record_result(seeded.latest, CellRecord(key=mixtral, axes=axes("mixtral-8x7b:tiny", "full"),
                                                           status="pass", attempt=2, metrics=metrics("mixtral-8x7b:tiny", "full", "sdpa", 3)))
        after = {u: c.get(u).text for u in urls}
    assert all(after[u] != before[u] for u in urls)
    assert "No new failures." in after["/diff"] and "Regression" in before["/diff"]
    assert {c["key"]: c["status"] for c in json.loads(after["/api/matrix"])["cells"]}[mixtral] == "pass"


def test_stale_banner_on_every_page_and_a_passing_reason_is_not_an_error(sqlite_client: TestClient) -> None:
    flaky = key("llama-3.1-8b:tiny", "breakable")  # pass_flaky in run 3: a reason, but a pass
    for path in (f"/cell?key={flaky}", "/diff", "/requests", "/runs", "/"):
        assert 'id="freshness"' in sqlite_client.get(path).text, path
    cell = sqlite_client.get(f"/cell?key={flaky}").text
    assert '<pre class="reason note" id="reason">' in cell
    broken = sqlite_client.get(f"/cell?key={key('mixtral-8x7b:tiny', 'full')}").text
    assert '<pre class="reason" id="reason">' in broken


def test_diff_tables_are_capped_with_the_rest_in_markdown(sqlite_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from web.routers import pages

    monkeypatch.setattr(pages, "DIFF_ROWS", 1)
    html = sqlite_client.get("/diff?base=1&head=3&threshold=0").text
    latencies = re.search(r'id="latencies">(.*?)</table>\s*(<p class="muted">.*?</p>)', html, re.DOTALL)
    assert latencies.group(1).count("<tr>") == 2  # the header and one row
    assert "more:" in latencies.group(2) and "format=md" in latencies.group(2)


def test_the_runs_list_reads_precounted_runs_not_their_cells(sqlite_client: TestClient) -> None:
    from sqlalchemy import event

    statements: list[str] = []
    engine = sqlite_client.app.state.store.views.engine
    listener = lambda conn, cursor, statement, *rest: statements.append(statement)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        html = sqlite_client.get("/runs").text
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert statements and not any("cell_results" in s for s in statements)
    assert "pass_flaky 1" in text(html)  # the counts are there all the same


def test_the_api_gives_the_support_summary_the_page_shows(sqlite_client: TestClient) -> None:
    s = sqlite_client.get("/api/support?run=3").json()
    assert s["run"]["id"] == 3
    assert {k: s["tally"][k] for k in ("passing", "failing", "eager_fail", "not_supported", "launched")} == {
        "passing": 19, "failing": 2, "eager_fail": 1, "not_supported": 2, "launched": 22}
    assert s["tally"]["pass_rate"] == pytest.approx(19 / 21)
    llama = next(v for v in s["by_axis"]["model"] if v["value"] == "llama-3.1-8b:tiny")
    assert (llama["tally"]["passing"], llama["tally"]["not_supported"]) == (4, 2)
    [group] = s["not_supported"]
    assert group["cells"] == 2 and group["shared"] == {"model": "llama-3.1-8b:tiny", "graph": "full"}
    hidden = sqlite_client.get("/api/matrix?run=3&unsupported=hide").json()
    assert (hidden["shown"], hidden["hidden"], hidden["total"]) == (22, 2, 24)
    assert sqlite_client.get("/api/matrix?run=3").json()["shown"] == 24  # the API shows every cell by default


def test_an_sglang_cell_s_model_is_a_summary_row_of_its_own_linking_to_its_engine() -> None:
    """pcg's and SGLang's verdicts on one model never share a tally: `model [sglang]` is its own row, its link
    filters on the engine too."""
    rows = [CellRecord(key="a", axes=axes("m:tiny", "full"), status="pass"),
            CellRecord(key="b", axes={**axes("m:tiny", "full"), "engine": "sglang"}, status="fail_capture", reason="x")]
    by_model = {v.value: v for v in support(rows, 7).by_axis["model"]}
    assert set(by_model) == {"m:tiny", "m:tiny [sglang]"}
    assert (by_model["m:tiny"].tally.passing, by_model["m:tiny"].tally.failing) == (1, 0)
    assert (by_model["m:tiny [sglang]"].tally.passing, by_model["m:tiny [sglang]"].tally.failing) == (0, 1)
    q = parse_qs(urlparse(by_model["m:tiny [sglang]"].href).query)
    assert q["model"] == ["m:tiny"] and q["engine"] == ["sglang"]
    assert "engine" not in parse_qs(urlparse(by_model["m:tiny"].href).query)
