"""Run a function on N CPU ranks (gloo), each a spawned process with torch's env:// variables set, as the
launcher starts a parallel cell's ranks; the ranks' return values come back by file."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    try:
        result = fn(rank, *args)
    except BaseException:
        result = {"error": traceback.format_exc()}
    torch.save(result, Path(out) / f"rank{rank}.pt")
    from pcg_core.distributed import shutdown

    shutdown()


def run_ranks(fn: Callable[..., Any], *args: Any, world: int = 2) -> list[Any]:
    """fn(rank, *args) on `world` spawned ranks; their results in rank order. A rank's exception comes back as
    {"error": traceback} and is raised here."""
    with tempfile.TemporaryDirectory() as out:
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # the children read it at import
        try:
            mp.spawn(_rank_main, args=(fn, world, free_port(), out, args), nprocs=world, join=True)
        finally:
            if old is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = old
        results = [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    for r, res in enumerate(results):
        if isinstance(res, dict) and "error" in res:
            raise AssertionError(f"rank {r} failed:\n{res['error']}")
    return results


@contextmanager
def planted_after_sharding(plant: Callable[[torch.nn.Module], None]) -> Iterator[None]:
    """Within the block, every cell's model goes through `plant(model)` right after run_cell shards it: a fault
    planted where only the tp1 check can see it."""
    import harness.cell.parallel as run

    real = run.shard_model

    def sharded_then_planted(model, group, **kw):
        record = real(model, group, **kw)
        plant(model)
        return record

    run.shard_model = sharded_then_planted
    try:
        yield
    finally:
        run.shard_model = real
