"""The pages in a real browser (Debian's chromium via Playwright) against a live server on a seeded database.

Also takes screenshots of the matrix and cell pages (into docs/screenshots/ with PCG_UPDATE_SCREENSHOTS=1). Skipped without chromium, except under CI (conftest).
"""

from __future__ import annotations

import json

from web_seed import MODELS, SCRIPT_CELL, key
from web_support import TOKEN, Tab, screenshot_path


def test_matrix_page_renders_the_seeded_run(tab: Tab, tmp_path) -> None:
    tab.goto("/")
    page = tab.page
    assert page.title().startswith("Matrix · run 3")
    coverage = page.locator("#coverage").inner_text()
    assert coverage.startswith("22 of 24 cells launched, 19 pass, 2 fail") and "pass rate 90.5% (19/21 counted)" in coverage
    assert page.locator("#support-model tbody tr").count() == len(MODELS)
    assert page.locator("#support-model svg.bar").count() == len(MODELS)
    assert page.locator("#matrix tbody th.model").all_inner_texts() == sorted(MODELS)
    assert page.locator("#matrix td a").count() == 22  # the 2 cells the runtime cannot run are hidden
    assert page.locator("#counts").inner_text().startswith("22 of 24 cells shown (2 not supported hidden)")
    assert "stale" in page.locator("#freshness").inner_text()
    # a failing cell: colour class, short label and a tooltip with the reason
    fail = page.locator("#matrix td.s-fail a", has_text="cap")
    assert fail.count() == 1
    assert fail.get_attribute("title").startswith("fail_capture: RuntimeError: capture failed in piece 3")
    # a passing cell: speedup label, tooltip with metrics
    ok = page.locator("#matrix td.s-pass a").first
    assert ok.inner_text().endswith("×")
    assert "speedup" in ok.get_attribute("title") and "pool" in ok.get_attribute("title")
    page.screenshot(path=str(screenshot_path("matrix.png", tmp_path)), full_page=True)


def test_a_reason_group_links_to_its_cells_and_the_switch_shows_them(tab: Tab) -> None:
    tab.goto("/")
    page = tab.page
    page.locator("#unsupported-reasons-box summary").click()
    group = page.locator("#unsupported-reasons tbody tr", has_text="sliding-window attention")
    with page.expect_navigation():
        group.locator("a").click()
    assert page.locator("#matrix td.s-not_run a").all_inner_texts() == ["n/s", "n/s"]
    assert page.locator("#unsupported").input_value() == "show"
    page.select_option("#unsupported", "hide")
    with page.expect_navigation():
        page.click("#filters button[type=submit]")
    assert page.locator("#all-hidden").is_visible() and page.locator("#matrix").count() == 0


def test_filters_take_several_values_and_keep_them(tab: Tab) -> None:
    tab.goto("/")
    page = tab.page
    page.select_option("#filters select[name=graph]", ["full", "breakable"])
    page.select_option("#filters select[name=status]", "passing")
    with page.expect_navigation():
        page.click("#filters button[type=submit]")
    assert "graph=full" in page.url and "graph=breakable" in page.url and "status=passing" in page.url
    assert page.locator("#matrix th.group").all_inner_texts() == ["graph=breakable", "graph=full"]
    assert page.locator("#matrix td.s-fail, #matrix td.s-not_run, #matrix td.s-eager_fail").count() == 0
    # the form keeps both choices
    assert page.eval_on_selector("#filters select[name=graph]",
                                 "s => [...s.selectedOptions].map(o => o.value)") == ["breakable", "full"]
    page.select_option("#filters select[name=group]", "attention")
    with page.expect_navigation():
        page.click("#filters button[type=submit]")
    assert page.locator("#matrix th.group").all_inner_texts() == ["attention=flash", "attention=sdpa"]


def test_history_strips_show_the_runs_before(tab: Tab, tmp_path) -> None:
    tab.goto("/?run=2")  # nightly run 2; run 1 is the nightly before it
    page = tab.page
    flipped = page.locator("#matrix td.flip")
    assert flipped.count() == 2  # qwen3-0.6b breakable: pass → fail_accuracy; mixtral breakable flash: oom → pass
    assert flipped.first.locator(".strip i").count() == 2
    assert page.locator("#matrix td .strip").count() == page.locator("#matrix td a").count()
    box = flipped.first.locator(".strip i").first.bounding_box()
    assert box is not None and box["width"] >= 3 and box["height"] >= 3  # drawn, not collapsed
    page.screenshot(path=str(screenshot_path("matrix-history.png", tmp_path)), full_page=True)


def test_cell_page_shows_history_plots_and_repro(tab: Tab, tmp_path) -> None:
    tab.goto("/")
    page = tab.page
    flaky_key = key("qwen3-0.6b:tiny", "breakable")  # pass → fail_accuracy → pass
    with page.expect_navigation():
        page.locator(f'#matrix a[href^="/cell?key={flaky_key.replace("|", "%7C")}&"]').click()
    assert page.locator("h1.key").inner_text() == flaky_key
    history = page.locator("#history tbody tr")
    assert history.count() == 3
    assert [history.nth(i).locator(".chip").inner_text() for i in range(3)] == ["pass", "fail_accuracy", "pass"]
    assert "2 flips in 3 runs" in page.locator(".status-line").inner_text()
    assert page.locator("#flaky").is_visible()
    assert page.locator("#repro").inner_text() == ("pcgh cell --model qwen3-0.6b --tiny --weights synthetic --quant none "
                                                   "--attention sdpa --parallel tp1 --graph breakable --compiler eager "
                                                   "--kv-cache auto --engine pcg --device cpu --dtype float32 --max-tokens 64")
    plots = page.locator("figure.plot")
    assert plots.count() == 3
    # speedup: 8 and 32 tokens in runs 1 and 3, a gap at the failed run 2 (points, no line across it)
    assert plots.nth(0).locator("circle").count() == 4 and plots.nth(0).locator("polyline").count() == 0
    assert plots.nth(1).locator("circle").count() == 3 and plots.nth(1).locator("polyline").count() == 1
    assert plots.nth(2).locator("circle").count() == 3 and plots.nth(2).locator("polyline").count() == 1
    page.screenshot(path=str(screenshot_path("cell.png", tmp_path)), full_page=True)


def test_a_log_with_script_is_text_and_nothing_runs(tab: Tab) -> None:
    tab.goto("/cell?key=" + key(*SCRIPT_CELL).replace("|", "%7C"))
    page = tab.page
    log = page.locator("#log")
    assert '<script>window.__pwned = 1; alert("pwned")</script>' in log.inner_text()
    assert '<img src=x onerror="window.__pwned=2">' in log.inner_text()
    assert page.locator("#log script, #log img").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert tab.dialogs == []


def _post(tab: Tab, path: str, body: dict, token: str | None) -> dict:
    """fetch() from the page, as a browser client of the API would."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    return tab.page.evaluate(
        """async ([path, headers, body]) => {
             const r = await fetch(path, {method: "POST", headers, body});
             return {status: r.status, body: await r.json()};
           }""", [path, headers, json.dumps(body)])


def test_upload_needs_the_token(tab: Tab) -> None:
    tab.goto("/docs")  # the API docs page: same origin, and the one page that runs scripts (Swagger UI)
    page = tab.page
    page.wait_for_selector(".swagger-ui .info .title")
    assert "pcg compatibility dashboard" in page.locator(".swagger-ui .info .title").inner_text()
    run = {"name": "from-browser", "matrix": "smoke", "trigger": "ci", "results": [
        {"key": key("qwen3-0.6b:tiny", "piecewise"), "axes": {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa",
                                                              "parallel": "tp1", "graph": "piecewise", "compiler": "eager"},
         "status": "pass"}]}
    assert _post(tab, "/api/runs", run, None)["status"] == 401
    assert _post(tab, "/api/runs", run, "wrong")["status"] == 401
    created = _post(tab, "/api/runs", run, TOKEN)
    assert created["status"] == 201
    tab.goto("/runs")
    assert f"#{created['body']['id']} from-browser" in page.locator("#runs").inner_text()


def test_a_filtered_question_is_answered_on_the_first_screen(tab: Tab, tmp_path) -> None:
    """`/?model=…&graph=…` shows the matching cells first, above the form, and the summary counts only them."""
    tab.goto("/?model=mixtral-8x7b:tiny&graph=full")
    page = tab.page
    viewport = page.viewport_size
    assert viewport is not None
    cells = page.locator("#matrix td a")
    assert cells.count() == 2  # sdpa and flash
    box = page.locator("#matrix").bounding_box()
    assert box is not None and box["y"] + box["height"] <= viewport["height"], (box, viewport)  # no scrolling
    assert page.locator("#coverage").inner_text().startswith("2 of 2 cells launched, 1 pass, 1 fail")
    assert "model=mixtral-8x7b:tiny" in page.locator("#filtered").inner_text()
    assert page.locator("#support-model tbody tr").count() == 1  # the summary is of the same cells
    assert page.locator("#matrix").evaluate(  # the grid comes before the form and the summary
        "m => !!(m.compareDocumentPosition(document.querySelector('#filters')) & Node.DOCUMENT_POSITION_FOLLOWING)")
    page.screenshot(path=str(screenshot_path("matrix-filtered.png", tmp_path)))
