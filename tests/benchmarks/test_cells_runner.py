"""benchmarks/cells_runner.py: gpu_cells.sh's cells side by side, no more together than their recorded peaks fit."""

from __future__ import annotations

import json
import sys
import time

from benchmarks.cells_runner import GIB, Cell, need, pick, read_todo, recorded_peaks, run

TODO = """1 deepseek-v3:4 flex piecewise eager none 4096
2 deepseek-v3:4 flex breakable eager none 4096 fp8_e4m3
3 qwen3-0.6b:tiny sdpa piecewise
4 mixtral-8x7b:2 flex piecewise eager nvfp4 4096
5 llama-3.1-8b:4 varlen full eager none 4096
"""


def _outcome(model, layers, quant, graph, kv, peak_gib, tiny=False):
    return json.dumps({"spec": {"model": model, "layers": layers, "tiny": tiny, "quant": quant, "graph": graph,
                                "kv_cache": kv}, "status": "pass",
                       "metrics": {"process": {"peak_gpu_bytes": int(peak_gib * GIB)}}})


def _peaks(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "c.jsonl").write_text("\n".join([
        _outcome("deepseek-v3", 4, "none", "piecewise", "auto", 30.0),
        _outcome("deepseek-v3", 4, "none", "piecewise", "auto", 32.0),  # the highest of a kind counts
        _outcome("deepseek-v3", 4, "none", "full", "fp8_e4m3", 28.0),
        _outcome("mixtral-8x7b", 2, "nvfp4", "piecewise", "auto", 9.0),
        "not json", "{}",
    ]))
    (tmp_path / "b.jsonl").write_text(_outcome("llama-3.1-8b", 4, "none", "full", "auto", 12.0))
    return recorded_peaks(tmp_path)


def test_the_peaks_are_the_highest_each_kind_recorded_and_a_cell_plans_with_its_kind_or_its_model(tmp_path):
    peaks = _peaks(tmp_path)
    cells = read_todo(["# a comment", *TODO.splitlines()])
    assert [c.index for c in cells] == [1, 2, 3, 4, 5]
    assert peaks[("deepseek-v3:4", "none", "piecewise", "auto")] == 32 * GIB
    assert need(cells[0], peaks) == 32 * 1.10 + 1.0
    assert need(cells[1], peaks) == 32 * 1.10 + 1.0  # breakable, FP8 cache: none recorded, its model's highest
    assert need(cells[2], peaks) is None and need(cells[3], peaks) == 9 * 1.10 + 1.0


def _indices(chosen):
    return [c.index for c, _ in chosen]


def test_cells_wait_for_room_and_only_known_ones_go_past_a_waiting_one(tmp_path):
    peaks = _peaks(tmp_path)
    cells = read_todo(TODO.splitlines())
    assert _indices(pick(cells, [], 8, 70.0, peaks)) == [1, 4, 5]  # 2 waits (36.2 + 36.2 > 70); 3 unknown stays behind it
    assert _indices(pick(cells, [], 8, 140.0, peaks)) == [1, 2, 3, 4, 5]  # an H200 holds them all
    assert [g for _, g in pick(cells, [], 8, 140.0, peaks)] == [32 * 1.10 + 1.0, 32 * 1.10 + 1.0, 0.0, 9 * 1.10 + 1.0,
                                                                  12 * 1.10 + 1.0]  # each as planned (0: unknown)
    assert _indices(pick(cells, [], 8, None, peaks)) == [1, 2, 3, 4, 5]  # no memory given: the jobs limit alone
    assert _indices(pick(cells, [], 2, 140.0, peaks)) == [1, 2]
    assert _indices(pick(cells[1:], [36.2], 8, 70.0, peaks)) == [4, 5]
    assert _indices(pick(cells[1:], [65.0, 0.0], 8, 70.0, peaks)) == []  # the unknown 3 does not jump the waiting 2
    assert _indices(pick([Cell(9, ("huge:8", "flex", "full"))], [], 8, 10.0, {("huge:8", "none", "full", "auto"): 99 * GIB})) == [9]


def test_run_starts_each_cell_once_and_never_overlaps_two_that_do_not_fit(tmp_path):
    peaks = {("big:4", "none", "piecewise", "auto"): 30 * GIB}
    log = tmp_path / "log"
    cells = read_todo(["1 big:4 flex piecewise", "2 big:4 flex piecewise", "3 small:tiny sdpa full"])
    # each cell: its start and end appended to the log
    cmd = [sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'a'); f.write(f'start {sys.argv[2]} {time.time()}\\n'); "
           "f.flush(); time.sleep(0.6); f.write(f'end {sys.argv[2]} {time.time()}\\n')", str(log)]
    t0 = time.time()
    run(cells, 8, 40.0, peaks, cmd, poll_s=0.05)
    events = [line.split() for line in log.read_text().splitlines()]
    when = {(e[0], e[1]): float(e[2]) for e in events}
    assert sorted(e[1] for e in events if e[0] == "start") == ["1", "2", "3"]
    assert when[("start", "2")] >= when[("end", "1")]  # 34 + 34 GiB > 40: one after the other
    # the unknown small one does not go past the waiting 2, then runs beside it
    assert when[("end", "1")] <= when[("start", "3")] < when[("end", "2")]
    assert time.time() - t0 < 10
