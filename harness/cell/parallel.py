"""A parallel cell's process group: one process per rank, each running run_cell(spec) with torch's env://
variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), as the launcher or torchrun starts them."""

from __future__ import annotations

from harness.cell.spec import CellSpec
from pcg_core.distributed import ParallelGroup, env_world_size, init_from_env
from pcg_core.errors import ConfigError
from pcg_core.known import parse_parallel


def parallel_group(spec: CellSpec) -> ParallelGroup | None:
    """This rank's group for a tensor-parallel cell (None for tp1): the cell runs as one process per rank, each
    calling run_cell with the same spec and torch's env:// variables set (the launcher, or torchrun)."""
    tp = parse_parallel(spec.parallel).get("tp", 1)
    world = env_world_size()
    if tp == 1 and world == 1:
        return None
    if world != tp:
        raise ConfigError(f"parallel {spec.parallel} runs as {tp} processes, one per rank; this one has WORLD_SIZE={world}: "
                          f"start the cell with `pcgh cell --parallel` or torchrun --nproc_per_node {tp}", field="parallel")
    return init_from_env(spec.device)
