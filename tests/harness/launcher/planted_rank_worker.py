"""A stand-in for the cell worker, planted by the rank tests (harness.launcher.ranks.WORKER): what a rank of a
parallel cell does, by the cell's graph name, without the runtime (the real worker's imports take seconds).

Like the real worker it reads the CellSpec on stdin, watches its runner's pipe, marks its phases on stderr and
writes a CellOutcome to argv[1]. Each rank writes its pid (and a child's, where it starts one) to
PCG_TEST_FLAKY_DIR/rank<r>.pid (.child.pid), so a test can check that nothing is left.

- test_ranks_ok: every rank passes, saying who it is (its env:// variables) in the reason
- test_ranks_allreduce: a gloo all_reduce of (rank + 1) over the ranks: the reason holds the sum and the env
- test_ranks_allreduce_nccl: the same over NCCL, each rank on its GPU (LOCAL_RANK of the cell's GPUs)
- test_rank1_crash: rank 1 dies by SIGSEGV once rank 0 is hung with a child of its own (in a collective, say)
- test_rank1_hang: rank 1 hangs with a child; rank 0 waits for it (hangs too)
- test_rank1_fails: rank 1 returns fail_accuracy, rank 0 passes
- test_rank1_flaky: rank 1 exits 3 the first time (a marker in PCG_TEST_FLAKY_DIR), passes the next
- test_gpus_hold: holds its GPUs for a second; the reason says which (CUDA_VISIBLE_DEVICES) and when
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The real worker's watchdog and phase marker, from their file: importing harness.launcher would import the runner
# (torch: seconds), which the planted worker exists to avoid.
_spec = importlib.util.spec_from_file_location("_cell_watch", Path(__file__).parents[3] / "harness/launcher/watch.py")
_worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_worker)
PHASE_MARK, watch_parent = _worker.PHASE_MARK, _worker.watch_parent

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
       "OMP_NUM_THREADS")


def _hang(folder: Path, rank: int) -> None:
    child = subprocess.Popen(["sleep", "3600"])
    (folder / f"rank{rank}.child.pid").write_text(str(child.pid))
    time.sleep(3600)


def _wait_for(path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def main() -> int:
    watch_parent()
    out = Path(sys.argv[1])
    spec = json.load(sys.stdin)
    rank = int(os.environ.get("RANK", "0"))  # a cell of one rank has no env:// variables
    folder = Path(os.environ["PCG_TEST_FLAKY_DIR"])
    (folder / f"rank{rank}.pid").write_text(str(os.getpid()))
    print(f"{PHASE_MARK} load", file=sys.stderr, flush=True)
    print(f"hello from rank {rank}", flush=True)
    graph = spec["graph"]
    info: dict = {k: os.environ.get(k) for k in ENV}
    status = "pass"
    if graph in ("test_ranks_allreduce", "test_ranks_allreduce_nccl"):
        import torch
        import torch.distributed as dist

        nccl = graph.endswith("_nccl")  # one GPU per rank: LOCAL_RANK among the cell's CUDA_VISIBLE_DEVICES
        if nccl:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            info["device_count"] = torch.cuda.device_count()
        dist.init_process_group("nccl" if nccl else "gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        t = torch.tensor([float(rank + 1)], device="cuda" if nccl else "cpu")
        dist.all_reduce(t)
        info.update(sum=t.item(), backend=dist.get_backend(), world=dist.get_world_size(), rank=dist.get_rank())
        dist.destroy_process_group()
    elif graph == "test_gpus_hold":
        info["start"] = time.time()
        time.sleep(1.5)
        info["end"] = time.time()
    elif graph == "test_rank1_crash":
        if rank == 1:
            _wait_for(folder / "rank0.child.pid")
            print("planted crash on rank 1", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        _hang(folder, rank)
    elif graph == "test_rank1_hang":
        _hang(folder, rank)
    elif graph == "test_rank1_fails" and rank == 1:
        status, info = "fail_accuracy", {"why": "planted mismatch on rank 1"}
    elif graph == "test_rank1_flaky" and rank == 1:
        marker = folder / "rank1-failed-once"
        if not marker.exists():
            marker.write_text("x")
            print("RuntimeError: planted one-off failure on rank 1", file=sys.stderr, flush=True)
            return 3
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"status": status, "reason": json.dumps(info)}))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
