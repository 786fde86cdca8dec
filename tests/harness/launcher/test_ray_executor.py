"""`pcgh run --executor ray` on a Ray cluster of this machine (ray.cluster_utils: a head and worker nodes, each a
raylet of its own, GPUs declared): the cells come back with the statuses the local executor gives them; a worker
node lost mid-run has its running cell run again on another node and nothing finished is lost; a driver killed
mid-run leaves a run `--resume` completes; a cell needing more GPUs than any node has is unsupported with that
reason. Each scenario starts raylets and runs tiny cells: slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from harness.cli import main  # noqa: E402
from harness.launcher.plan import RunOptions, plan  # noqa: E402
from harness.store import Store  # noqa: E402

pytestmark = pytest.mark.slow
SMOKE = Path(__file__).parents[3] / "harness" / "configs" / "smoke.yaml"
# 2 launched cells (sdpa and flex under full) and 1 refused (varlen: CUDA only)
SLICE = ["--filter", "model=qwen3-0.6b:tiny", "--filter", "quant=none", "--filter", "parallel=tp1",
         "--filter", "kv_cache=auto", "--filter", "graph=full"]
EXPECTED = {"pass": 2, "unsupported": 1}


@pytest.fixture
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _statuses(db: str) -> tuple[dict[str, str], list]:
    with Store(db) as store:
        run = store.run("latest")
        return {r.key: str(r.status) for r in store.results(run.id)}, store.results(run.id, all_attempts=True)


def _wait_for(pred, timeout: float = 240.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.5)


def test_a_lost_node_s_running_cell_runs_again_elsewhere_and_nothing_finished_is_lost(cluster, tmp_path):
    a = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    db, logs = str(tmp_path / "r.db"), tmp_path / "logs"

    def lose_node_a():  # both nodes hold a running cell once two attempt logs exist: node A's dies with it
        _wait_for(lambda: len(list(logs.rglob("*.attempt1.log"))) >= 2)
        cluster.remove_node(a)

    killer = threading.Thread(target=lose_node_a, daemon=True)
    killer.start()
    code = main(["run", str(SMOKE), "--db", db, "--logs", str(logs), "--executor", "ray", "--address",
                 cluster.address, "--no-report", *SLICE])
    killer.join(timeout=5)
    assert not killer.is_alive() and code == 0
    final, attempts = _statuses(db)
    assert sorted(final.values()) == sorted(s for s, n in EXPECTED.items() for _ in range(n)), final
    assert all(r.attempt == 1 for r in attempts) and len(attempts) == len(final)  # the lost run left no record


def test_a_killed_driver_leaves_a_run_that_resume_completes(cluster, tmp_path):
    cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    db, logs = str(tmp_path / "r.db"), str(tmp_path / "logs")
    args = ["run", str(SMOKE), "--db", db, "--logs", logs, "--executor", "ray", "--address", cluster.address,
            "--no-report", *SLICE]
    driver = subprocess.Popen([sys.executable, "-m", "harness.cli", *args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def launched_done() -> int:
        if not Path(db).exists():
            return 0
        try:
            return sum(s != "unsupported" for s in _statuses(db)[0].values())
        except Exception:  # noqa: BLE001 - the store is being created
            return 0

    _wait_for(lambda: launched_done() >= 1)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=60) != 0
    before, attempts_before = _statuses(db)
    assert 1 <= sum(s != "unsupported" for s in before.values()) < EXPECTED["pass"]
    with Store(db) as store:
        assert store.run("latest").status == "interrupted"
    assert main([*args, "--resume"]) == 0
    final, attempts = _statuses(db)
    assert sorted(final.values()) == sorted(s for s, n in EXPECTED.items() for _ in range(n)), final
    assert all(a in attempts for a in attempts_before)  # what finished before the kill is kept as it was
    with Store(db) as store:
        assert store.run("latest").status == "finished"


def test_a_cell_needing_more_gpus_than_any_node_has_is_unsupported(cluster, tmp_path):
    cluster.add_node(num_cpus=1, num_gpus=2)
    cluster.wait_for_nodes()
    matrix = tmp_path / "m.yaml"
    matrix.write_text("name: gpus\ndefaults:\n  device: cuda\n  max_tokens: 64\naxes:\n  model: [llama-3.1-8b:tiny]\n"
                      "  quant: [none]\n  attention: [sdpa]\n  parallel: [tp2, tp4]\n  graph: [piecewise]\n"
                      "  compiler: [eager]\n")
    cells = {c.axes["parallel"]: c for c in plan(matrix, RunOptions(executor="ray", address=cluster.address)).cells}
    assert "needs 4 GPUs" in (cells["tp4"].unsupported or "") and "Ray cluster's largest node" in cells["tp4"].unsupported
    assert "GPUs" not in (cells["tp2"].unsupported or ""), cells["tp2"].unsupported
