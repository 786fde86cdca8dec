"""Cells as Ray tasks (`pcgh run --executor ray [--address …]`): the matrix over a cluster instead of one host.

Each attempt of a cell is one Ray task asking for the cell's GPUs (one per rank, on one node: Ray hands a task its
GPUs on a single node and sets CUDA_VISIBLE_DEVICES) and a CPU; on the node it runs the same isolated worker as the
local executor (process.launch_repeated: timeout, crash classification, its own process groups, which die with
the task). The driver keeps everything else as the local executor does: the retry of a failed attempt, the record
of each attempt the moment it returns, resume keys, progress. A task whose node is lost is run again elsewhere
by Ray (NODE_RETRIES); a result that came back is in the store already, so nothing finished is lost.

`ray` is an optional extra (`pip install pcg[ray]`); the local executor stays the default. Every node needs pcg
installed as on the driver (its cells import it); logs are written on the node that ran the cell, and the record
carries the log's tail into the store as it does locally.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcg_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.matrix import Cell
    from harness.outcome import CellRecord

NODE_RETRIES = 3  # a task whose node died (or whose worker process was killed) runs again on another node
DRIVER_THREADS = 256  # attempts waited for side by side; Ray's resources decide how many run


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ConfigError("--executor ray needs Ray: pip install 'pcg[ray]' (ray>=2.60) on the driver and every "
                          "node", field="executor") from e
    return ray


def connect(address: str | None, jobs: int = 1) -> None:
    """Join the cluster at `address` (ray://… or host:port; None: the one RAY_ADDRESS names, else a Ray started on
    this machine for the run with `jobs` CPUs, so that --jobs means what it means locally); once per process."""
    ray = _ray()
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS") == "":  # a CI variable left unset: no cluster named
        del os.environ["RAY_ADDRESS"]
    local = address is None and not os.environ.get("RAY_ADDRESS")
    try:
        ray.init(address=address, num_cpus=jobs if local else None, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise ConfigError(f"--address {address}: no Ray cluster could be joined there ({e}); start one with "
                          "`ray start --head` and give its address", field="address") from e


def largest_node_gpus() -> int:
    """The most GPUs any live node of the cluster has: a cell's ranks run on one node."""
    return max((int(n.get("Resources", {}).get("GPU", 0)) for n in _ray().nodes() if n.get("Alive")), default=0)


def _on_node(cell: Cell, log_path: str, repeats: int, attempt: int) -> str:
    """One attempt of `cell` on the node Ray placed it on, its GPUs Ray's; the record as JSON."""
    from harness.launcher.groups import WorkerGroups
    from harness.launcher.process import launch_repeated

    ray = _ray()
    gpus = [int(g) for g in ray.get_gpu_ids()] or None
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with WorkerGroups() as groups:  # the cell's processes die with this task's
        record = launch_repeated(cell, Path(log_path), gpus, repeats, attempt, groups=groups)
    return record.model_dump_json()


class RaySeats:
    """Where a cell runs under Ray: anywhere the cluster has its resources. The driver waits on each attempt in a
    thread of its own; close() cancels what is still running or waiting (an interrupted run)."""

    def __init__(self, on_cuda: bool) -> None:
        self.on_cuda = on_cuda
        self.workers = DRIVER_THREADS
        self._refs: set[Any] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._task = _ray().remote(_on_node)

    def run(self, cell: Cell, attempts: Any) -> str:
        return attempts(cell, None)

    def launch(self, cell: Cell, log_path: Path, gpu: list[int] | None, repeats: int, attempt: int) -> CellRecord:
        """One attempt of `cell` as a Ray task: its GPUs (one per rank on CUDA, chosen by Ray on the node: `gpu` is
        always None here) and a CPU."""
        from harness.launcher.groups import Cancelled
        from harness.outcome import CellRecord

        ray = _ray()
        # One CPU a cell, however many ranks, as a local run gives a cell one of its --jobs slots (its ranks share
        # the cores): a request of one CPU a rank would never be placed on a node with fewer CPUs than ranks.
        opts = {"num_cpus": 1, "num_gpus": max(1, cell.ranks) if self.on_cuda else 0, "max_retries": NODE_RETRIES}
        with self._lock:
            if self._closed:
                raise Cancelled("the runner is shutting down")
            ref = self._task.options(**opts).remote(cell, str(log_path), repeats, attempt)
            self._refs.add(ref)
        try:
            text = ray.get(ref)
        except (ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError) as e:
            if self._closed:
                raise Cancelled("the runner is shutting down") from e
            raise
        finally:
            with self._lock:
                self._refs.discard(ref)
        return CellRecord.model_validate_json(text)

    def close(self) -> None:
        ray = _ray()
        with self._lock:
            self._closed = True
            refs = list(self._refs)
        for ref in refs:
            ray.cancel(ref, force=True)
