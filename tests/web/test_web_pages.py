"""The HTML pages through TestClient: they render, escape, mark staleness, and load nothing from elsewhere."""

from __future__ import annotations

import re
from datetime import datetime, UTC
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from web_seed import SCRIPT_CELL, key, seed

from harness.reports import diff_markdown, diff_runs
from harness.store import RequestRow, Store
from web.app import create_app
from web.deps import CSP


def flat(html: str) -> str:
    """The HTML with runs of whitespace as one space, as a browser shows text."""
    return " ".join(html.split())


def text(html: str) -> str:
    """What a browser shows of the HTML's text: tags dropped, whitespace runs as one space."""
    return flat(re.sub(r"<[^>]+>", "", html))


PAGES = ["/", "/?run=1&group=attention", "/?graph=full&status=failing", "/runs", "/runs/1", "/runs/latest", "/diff",
         "/diff?base=1&head=3", "/requests", f"/cell?key={key('qwen3-0.6b:tiny', 'breakable')}",
         f"/cell?key={key('qwen3-8b:trim:4', 'full')}&run=2"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_render_with_a_strict_csp_and_local_assets_only(sqlite_client: TestClient, path: str) -> None:
    r = sqlite_client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CSP and "script-src 'none'" in CSP
    assert "<script" not in r.text
    refs = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert refs and all(u.startswith(("/", "data:")) for u in refs), [u for u in refs if not u.startswith("/")]


def test_the_log_is_escaped(sqlite_client: TestClient) -> None:
    html = sqlite_client.get("/cell", params={"key": key(*SCRIPT_CELL)}).text
    assert "&lt;script&gt;window.__pwned = 1; alert(&#34;pwned&#34;)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=&#34;window.__pwned=2&#34;&gt;" in html
    assert "<script>" not in html and "<img" not in html


def test_matrix_page_cells_link_their_cell_page(sqlite_client: TestClient) -> None:
    html = sqlite_client.get("/?unsupported=show").text
    cells = re.findall(r'<td class="(s-[a-z_]+)[a-z ]*"><a href="([^"]+)" title="([^"]*)">([^<]*)(?:<span class="strip">.*?</span>)?</a></td>', html)
    assert len(cells) == 24
    hrefs = {h.replace("&amp;", "&") for _, h, _, _ in cells}
    assert f"/cell?key={key('mixtral-8x7b:tiny', 'full').replace('|', '%7C')}&run=3" in hrefs
    page = sqlite_client.get(next(iter(hrefs)))
    assert page.status_code == 200 and "Reproduce" in page.text
    broken = [c for c in cells if c[3] == "cap"]
    tip = "fail_capture: RuntimeError: capture failed in piece 3\ncapture 1.10 s · pool 7.0 MiB · token match 0.750"
    assert broken == [("s-fail", broken[0][1], tip, "cap")]
    assert '<th class="group" colspan="2">graph=breakable</th>' in html
    assert "24 of 24 cells shown" in flat(html)
    assert ("22 of 24 cells launched, 19 pass, 2 fail, 1 fail in eager too · 2 not yet supported · pass rate 90.5% "
            "(19/21 counted)") in text(html)
    hidden = sqlite_client.get("/").text  # by default the cells the runtime cannot run are counted, not shown
    assert "22 of 24 cells shown (2 not supported hidden)" in text(hidden)
    assert "s-not_run" not in hidden.split('id="matrix"')[1]


def test_filter_form_keeps_its_choices(sqlite_client: TestClient) -> None:
    html = sqlite_client.get("/?graph=full&status=failing&group=quant").text
    assert re.search(r'<select name="graph" multiple[^>]*>.*?<option selected>full</option>', html, re.DOTALL)
    assert re.search(r'<select name="status" multiple[^>]*>.*?<option selected>failing</option>', html, re.DOTALL)
    assert re.search(r'<select name="group">.*?<option selected>quant</option>', html, re.DOTALL)
    assert "1 of 24 cells shown" in html
    assert "No cell matches these filters." in sqlite_client.get("/?model=nothing").text
    assert sqlite_client.get("/?group=model").status_code == 200  # an unknown group falls back to graph


def test_stale_nightly_is_marked_until_a_fresh_one_lands(tmp_path: Path) -> None:
    seeded = seed(f"sqlite:///{tmp_path / 'pcg.db'}")
    with TestClient(create_app(seeded.url)) as c:
        for path in ("/", "/runs", "/runs/3"):
            assert re.search(r'id="freshness">⚠ newest nightly run #2 \(nightly\) is \d+ days old: stale', c.get(path).text)
        with Store(seeded.url) as store:
            run_id = store.create_run("nightly", "harness/configs/nightly.yaml", {}, trigger="nightly")
            store.finish_run(run_id)
        runs = c.get("/runs").text
        assert 'id="freshness"' not in runs and 'id="freshness"' not in c.get("/").text
        assert f"newest nightly run #{run_id} (nightly) is 0 min old" in runs


def test_runs_page_keeps_the_dirty_mark_of_a_shortened_sha(tmp_path: Path) -> None:
    with TestClient(create_app(f"sqlite:///{tmp_path / 'pcg.db'}")) as c:
        with Store(c.app.state.store.url) as store:
            store.create_run("manual", "m.yaml", {"git_sha": "0123456789abcdef0123456789abcdef01234567-dirty"})
            store.create_run("manual", "m.yaml", {"git_sha": "fedcba9876543210fedcba9876543210fedcba98"})
        runs = c.get("/runs").text
        assert "<code>0123456789-dirty</code>" in runs and "<code>fedcba9876</code>" in runs


def test_empty_store_and_missing_things(tmp_path: Path) -> None:
    with TestClient(create_app(f"sqlite:///{tmp_path / 'empty.db'}")) as c:
        r = c.get("/")
        assert r.status_code == 200 and "there is no latest run" in r.text and "pcgh run harness/configs/smoke.yaml" in r.text
        assert "no nightly run in the store yet" in c.get("/runs").text
        r = c.get("/diff")  # the nav's Diff link: a page saying why there is no diff, not a 404
        assert r.status_code == 200 and "A diff compares two runs, and this store has none yet." in text(r.text)
        with Store(c.app.state.store.url) as store:
            store.finish_run(store.create_run("smoke", "harness/configs/smoke.yaml", {}))
        r = c.get("/diff")
        assert r.status_code == 200 and "this store has one: #1 smoke." in text(r.text) and 'href="/runs/1"' in r.text
        assert c.get("/diff?format=md").status_code == 404 and c.get("/diff?head=1").status_code == 404
    with TestClient(create_app(seed(f"sqlite:///{tmp_path / 'pcg.db'}").url)) as c:
        for path in ("/?run=9", "/runs/9", "/cell?key=nope", "/diff?base=9"):
            r = c.get(path)
            assert r.status_code == 404 and 'id="error"' in r.text, path
        assert c.get("/cell").status_code == 422  # key is required


def test_run_page_shows_provenance_and_the_reports_pass_rate(sqlite_client: TestClient) -> None:
    html = sqlite_client.get("/runs/1").text
    assert "<code>0000000000000000000000000000000000000001</code>" in html and "NVIDIA H200" in html
    assert "41m 00s" in html
    assert ("Pass rate <strong>90.5%</strong> (19 passing of 21 counted; 3 eager_fail/unsupported/skipped not counted)"
            in flat(html))
    assert '<a href="/diff?base=1&amp;head=2">' not in html  # run 1 has no run before it
    assert '<a href="/diff?base=2&amp;head=3">diff with #2</a>' in sqlite_client.get("/runs/3").text


def test_diff_page_new_failures_first_and_markdown_is_pcgh_diff(sqlite_client: TestClient, tmp_path: Path) -> None:
    html = sqlite_client.get("/diff").text
    assert "Regression: 1 new failure(s)." in html
    assert html.index("New failures (1)") < html.index("Fixes (1)") < html.index("Other status changes (1)")
    md = sqlite_client.get("/diff?base=2&head=3&format=md")
    assert md.headers["content-type"].startswith("text/markdown")
    url = sqlite_client.app.state.store.url
    with Store(url) as store:
        expected = diff_markdown(diff_runs(store.results(2), store.results(3)), store.run(2), store.run(3))
    assert md.text == expected
    faster = sqlite_client.get("/diff?base=1&head=3&threshold=0").text  # seeded graph latency drops run by run
    assert 'id="latencies"' in faster and "Graph latency changes (" in faster and 'class="num better">▼ faster -' in faster
    assert faster.index('id="latencies"') < faster.index('id="speedups"')  # the graph's own time first


def test_requests_page_lists_the_queue(sqlite_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = [{"id": 2, "created_at": datetime(2026, 2, 1, tzinfo=UTC), "model": "Qwen/Qwen3-0.6B",
              "revision": None, "architecture": "Qwen3ForCausalLM", "supported": True, "status": "in_matrix",
              "card_id": "qwen3-0.6b", "verdict": {"verdicts": {"model": {"ok": True, "reason": "in the table"},
                                                               "graph": {"ok": False, "reason": "<b>no</b>"}}}},
             {"id": 1, "created_at": datetime(2026, 1, 1, tzinfo=UTC), "model": "org/new-model",
              "revision": "v2", "architecture": "NewForCausalLM", "supported": False, "status": "requested",
              "card_id": None, "verdict": {}},
             {"id": 3, "created_at": datetime(2026, 1, 2, tzinfo=UTC), "model": "Qwen/Qwen3-Next-80B-A3B",
              "revision": None, "architecture": "Qwen3NextForCausalLM", "supported": False, "status": "unsupported",
              "card_id": "qwen3-next-80b-a3b", "verdict": {},
              "outcome": {"id": 9, "request_id": 3, "run_id": 3, "recorded_at": datetime(2026, 1, 3, tzinfo=UTC),
                          "status": "unsupported", "reason": "none of its 3 cell(s) runs: <i>hybrid</i>"}}]
    rows = [RequestRow.model_validate({"config_hash": "c" * 64, **r}) for r in queue]
    monkeypatch.setattr(Store, "requests", lambda self, limit=None, status=None: rows, raising=False)
    html = sqlite_client.get("/requests").text
    assert html.index("Qwen/Qwen3-0.6B") < html.index("org/new-model")
    assert '<span class="chip req-in_matrix">in_matrix</span>' in html
    assert '<a href="/?model=qwen3-0.6b:*">6/6 pass</a>' in html and "not in the latest run" in html
    assert 'title="&lt;b&gt;no&lt;/b&gt;">graph ✗</span>' in html
    # what the last nightly found, with its run (escaped like everything else the store hands over)
    assert '<span class="chip req-unsupported">unsupported</span>' in html
    assert 'none of its 3 cell(s) runs: &lt;i&gt;hybrid&lt;/i&gt; (<a href="/runs/3">run 3</a>)' in html


def test_docs_are_swagger_ui_from_our_own_static_files(sqlite_client: TestClient) -> None:
    html = sqlite_client.get("/docs").text
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sorted(refs) == ["/static/swagger/favicon-32x32.png", "/static/swagger/swagger-ui-bundle.js",
                            "/static/swagger/swagger-ui.css"]
    assert "cdn" not in html and "http" not in html.replace("'/openapi.json'", "")
    for ref in refs:
        assert sqlite_client.get(ref).status_code == 200
    assert sqlite_client.get("/redoc").status_code == 404
    assert sqlite_client.get("/static/style.css").status_code == 200


def test_the_cell_page_shows_what_the_judge_looked_at(tmp_path: Path) -> None:
    """The suite's coverage, stored with the cell (harness.outcome.SuiteCoverage), on its page; a cell stored before
    coverage existed has no such section."""
    from harness.metrics import CellMetrics, SuiteCoverage

    cov = SuiteCoverage(buckets=10, buckets_hit=7, largest_bucket_hit=False, regions=2, regions_hit=2,
                        layouts={16: 5, 64: 2}, decode_steps=14, decode_layouts=5, beyond_ladder_forwards=8,
                        eager_forwards=1, repeat_identical=True)
    page, older = _cell_pages(tmp_path, CellMetrics(coverage=cov))
    assert "What the judge looked at" in page
    assert "7/10 buckets (largest NO)" in page and "largest not replayed" in page
    assert "16: 5, 64: 2" in page and "14 (5 batch memberships)" in page and "bitwise equal to its first run" in page
    assert "What the judge looked at" not in older


def _cell_pages(tmp_path: Path, metrics, status: str = "pass") -> tuple[str, str]:
    """The text of the cell page of a cell with `metrics`, and of one stored with none (before they existed)."""
    from harness.metrics import CellMetrics
    from harness.outcome import CellRecord

    axes = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "full",
            "compiler": "eager"}
    cell = CellRecord(key="k1", axes=axes, status=status, metrics=metrics)
    older = CellRecord(key="k2", axes={**axes, "graph": "piecewise"}, status="pass", metrics=CellMetrics())
    url = f"sqlite:///{tmp_path / 'cells.db'}"
    with Store(url) as store:
        store.import_run("smoke", "smoke.yaml", {}, [cell, older])
    with TestClient(create_app(url)) as client:
        return (text(client.get("/cell", params={"key": "k1"}).text),
                text(client.get("/cell", params={"key": "k2"}).text))


def test_the_cell_page_shows_the_reference_layer(tmp_path: Path) -> None:
    """Is eager right? The reference layer's verdict and numbers on the cell page; a cell stored before the layer
    existed has no such section."""
    from harness.metrics import CellMetrics, ReferenceCheck

    ref = ReferenceCheck(status="fail", reason="the kernels differ from their reference math", attention="sdpa",
                         positions=228, mean_logprob_diff=0.8, max_logprob_diff=5.1, mean_noise=0.002, max_noise=0.04,
                         mean_bound=0.01, max_bound=0.16, positions_over_max=200, token_flips=3, kernel_rel=912.0,
                         kernel_bound=0.005, kernel_layer="attention 0's input", kernel_noise=0.001, scheme_rel=0.04)
    page, older = _cell_pages(tmp_path, CellMetrics(reference=ref), status="fail_accuracy")
    assert "Is eager right?" in page and "the kernels differ from their reference math" in page
    assert "912 (bound 0.005) at attention 0" in page and "over 228 positions" in page
    assert "Is eager right?" not in older


def test_the_cell_page_shows_a_parallel_cells_ranks(tmp_path: Path) -> None:
    """A cell of several ranks: its GPUs, each rank's outcome (the record is rank 0's) and the sharded eager against
    the unsharded one, on its page; a single-process cell has no such section."""
    from harness.metrics import CellMetrics

    page, older = _cell_pages(tmp_path, CellMetrics(gpus=2, rank_statuses=["pass", "fail_accuracy"],
                                                    tp1_logprob_diff=0.0123), status="fail_accuracy")
    assert "Ranks in run" in page and "on 2 GPUs" in page
    assert "rank 0 pass rank 1 fail_accuracy" in page and "max |Δ prompt logprob| 0.0123" in page
    assert "Ranks in run" not in older


def test_a_cpu_runs_page_does_not_headline_a_graph_speedup(tmp_path: Path) -> None:
    """On CPU no CUDA graph is captured: the eager-vs-backend timings are no graph speedup to headline."""
    from harness.outcome import CellRecord

    axes = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "full",
            "compiler": "eager"}
    cell = CellRecord(key="k", axes=axes, status="pass", metrics={"speedup": {"8": 1.5}, "graphs_captured": 0},
                      log="", duration_s=1.0, attempt=1)
    with TestClient(create_app(f"sqlite:///{tmp_path / 'cpu.db'}")) as c:
        with Store(c.app.state.store.url) as store:
            store.import_run("smoke", "harness/configs/smoke.yaml", {}, [cell])
        page = text(c.get("/runs/1").text)
    assert "Speedup not measured on CPU (no CUDA graphs are captured there;" in page and "Geomean" not in page
