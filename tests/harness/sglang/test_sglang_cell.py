"""An SGLang cell end to end on the CPU, its two servers played by pcg's engine behind SGLang's API (pcg_server.py,
started from the very flags an SGLang server gets), and the judge's layers on their own with planted faults."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time

import pytest

from harness.cell.prompts import Case
from harness.cell.spec import CellSpec
from harness.outcome import Status
from harness.sglang.cell import model_folder, run_sglang_cell
from harness.sglang.client import GraphPasses
from harness.sglang.judge import judge_sglang, replay_problems
from pcg_core.engine import SequenceOutput

PCG_SERVER = (sys.executable, "-m", "harness.sglang.pcg_server")


def _spec(**kw) -> CellSpec:
    return CellSpec(**{"model": "qwen3-0.6b", "tiny": True, "weights": "synthetic", "device": "cpu", "graph": "breakable",
                       "attention": "sdpa", "engine": "sglang", "max_tokens": 32, "max_new_tokens": 3, **kw})


@pytest.mark.slow
def test_a_cell_runs_both_servers_and_a_cpu_without_graphs_is_no_pass(tmp_path):
    """The reference agrees with itself, the candidate with the reference token for token — and the candidate's
    own count says no prefill ran a CUDA graph (there are none on a CPU), so the cell is not a pass."""
    outcome = run_sglang_cell(_spec(), tmp_path, health_timeout_s=300, command=PCG_SERVER)
    assert outcome.status == Status.FAIL_CAPTURE, outcome.reason
    assert "did not replay" in outcome.reason and "0 prefill forward(s) by graph" in outcome.reason
    assert outcome.metrics.judge.token_match == 1.0 and outcome.metrics.judge.max_prompt_logprob_diff < 1e-5  # padding


def test_a_server_that_cannot_start_ends_the_cell_with_its_log(tmp_path):
    outcome = run_sglang_cell(_spec(), tmp_path, health_timeout_s=60,
                              command=(sys.executable, "-c", "import sys; print('no GPU here'); sys.exit(3)"))
    assert outcome.status == Status.EAGER_FAIL and "exited (3) before it was healthy" in outcome.reason
    assert "no GPU here" in outcome.reason


def test_the_model_folder_is_the_cards_config_as_the_cell_asks(tmp_path):
    folder = model_folder(_spec(model="deepseek-v3", tiny=False, layers=2, quant="fp8_block"), tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["quantization_config"]["weight_block_size"] == [128, 128]
    with pytest.raises(ValueError, match="no synthetic nvfp4"):
        model_folder(_spec(quant="nvfp4"), tmp_path)


# The judge's layers, on outputs of a real engine run, with faults planted -----------------------------------------

@pytest.fixture(scope="module")
def outputs():
    from harness.cards import find_card
    from pcg_core import Engine, EngineConfig, load_model

    lm = load_model(find_card("qwen3-0.6b").config, tiny=True)
    engine = Engine(lm.model, EngineConfig())
    prompts = [list(range(3, 20)), list(range(30, 36))]
    return {"two": engine.generate(prompts, 4, 3, prompt_logprobs=True)}


CASES = [Case("two", ((0,) * 17, (0,) * 6), (4, 4))]
REPLAYED = {"two": GraphPasses(prefill_graph=1.0, prefill_eager=0.0)}


def _moved(outs, case="two", seq=0, pos=2, by=0.5):
    """A copy with one prompt logprob moved: what a wrong graph does to one position."""
    outs = copy.deepcopy(outs)
    o: SequenceOutput = outs[case][seq]
    o.prompt_logprobs[pos] += by
    return outs


def test_equal_servers_with_replayed_graphs_pass(outputs):
    status, reason, j = judge_sglang(CASES, outputs, outputs, outputs, REPLAYED, 64, 1e-3)
    assert status == Status.PASS and j.token_match == 1.0


def test_a_candidate_off_the_reference_fails_accuracy(outputs):
    status, reason, _ = judge_sglang(CASES, outputs, outputs, _moved(outputs), REPLAYED, 64, 1e-3)
    assert status == Status.FAIL_ACCURACY and "prompt logprob diff 0.5" in reason


def test_a_reference_unlike_itself_is_eager_nondeterministic(outputs):
    status, reason, _ = judge_sglang(CASES, outputs, _moved(outputs, by=0.2), outputs, REPLAYED, 64, 1e-3)
    assert status == Status.EAGER_NONDETERMINISTIC and "against itself" in reason


def test_noise_the_reference_shows_itself_widens_the_bound(outputs):
    noisy = _moved(outputs, by=5e-4)  # within 1e-3: the reference's own noise
    status, _, _ = judge_sglang(CASES, outputs, noisy, _moved(outputs, by=9e-4), REPLAYED, 64, 1e-3)
    assert status == Status.PASS


@pytest.mark.parametrize("passes,ok", [
    (GraphPasses(prefill_graph=2.0), True),
    (GraphPasses(prefill_graph=1.0, prefill_eager=1.0), False),  # one of its forwards fell back to eager
    (GraphPasses(), False),  # no forward at all by graph
])
def test_an_eager_fallback_is_not_a_pass(outputs, passes, ok):
    status, reason, _ = judge_sglang(CASES, outputs, outputs, outputs, {"two": passes}, 64, 1e-3)
    assert (status == Status.PASS) == ok, reason
    if not ok:
        assert status == Status.FAIL_CAPTURE and "an eager fallback is not a pass" in reason


def test_cases_past_the_prefill_graphs_may_run_eagerly():
    big = Case("big", ((1,) * 100,), (2,))
    chunked = dataclasses.replace(CASES[0], name="chunked", chunk=8)
    eager = GraphPasses(prefill_eager=1.0)
    assert replay_problems([big, chunked], {"big": eager, "chunked": eager}, 64) == []
    assert replay_problems([CASES[0]], {"two": eager}, 64) == ["two: 0 prefill forward(s) by graph, 1 eager"]


def test_the_launcher_runs_an_sglang_cell_as_one_worker_that_starts_its_servers(tmp_path, monkeypatch):
    """The matrix launcher's worker sends an SGLang cell to its runner (one process: the server starts its own
    ranks), which starts `PCG_SGLANG_PYTHON -m sglang.launch_server`: here pcg's python, without sglang, so the
    reference server dies at once and the cell says so, with the server's log in its own."""
    from harness.launcher.process import launch
    from harness.matrix import Cell

    monkeypatch.setenv("PCG_SGLANG_PYTHON", sys.executable)
    spec = _spec(parallel="tp2")
    axes = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp2", "graph": "breakable",
            "compiler": "eager", "kv_cache": "auto", "engine": "sglang"}
    cell = Cell("k", axes, spec, 300)
    assert cell.processes == 1 and cell.ranks == 2
    record = launch(cell, tmp_path / "cell.log", None)
    assert record.status == Status.EAGER_FAIL and "No module named 'sglang'" in record.reason
    assert "--- reference.log" in record.log and "PCG-SGLANG reference:" in record.log


def test_a_server_never_healthy_is_torn_down_with_its_children(tmp_path):
    """A server that never answers /health (here: a process that starts a child and sleeps) is killed, its whole
    process group, when the wait times out."""
    from pathlib import Path

    from harness.sglang.server import running_server

    pids = tmp_path / "pids"
    script = (f"import os, subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(600)")
    with pytest.raises(TimeoutError, match="not healthy after 8 s"):
        with running_server([], 1, tmp_path / "s.log", 8, command=(sys.executable, "-c", script)):
            pass
    for pid in map(int, pids.read_text().split()):
        stat = Path(f"/proc/{pid}/stat")
        # gone, or a zombie left for an init that does not reap (a container's): dead either way
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", pid


def test_stop_group_returns_once_a_child_ignoring_sigterm_is_dead(tmp_path):
    """A scheduler process that ignores SIGTERM outlives its leader; stop_group kills it and returns only when no
    process of the group is left running (checked through /proc, where a zombie is dead)."""
    import subprocess

    from harness.sglang.server import _group_running, stop_group

    pids = tmp_path / "pids"
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    script = (f"import os, subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(1); "
              f"open({str(pids)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group_running(proc.pid)
    stop_group(proc, grace_s=1.0)
    assert not _group_running(proc.pid)
