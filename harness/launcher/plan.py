"""Planning a run: the matrix's cells after filters, tier and shard, each pre-checked against the runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.matrix import Cell, Matrix, load_matrix, precheck, select, shard
from pcg_core.capabilities import capabilities

if TYPE_CHECKING:
    from harness.cards import ModelCard


@dataclass
class RunOptions:
    jobs: int = 1
    shard: tuple[int, int] | None = None
    resume: bool = False
    filters: list[dict[str, str]] = field(default_factory=list)
    tier: str | None = None
    trigger: str = "manual"
    logs_dir: Path = Path("pcg-logs")
    retry: bool = True  # a failed cell gets a second attempt (pass then: pass_flaky); not with repeats > 1
    repeats: int = 1  # fresh processes per attempt; any non-pass among them is the cell's status
    progress: bool = True
    extra_models: tuple[str, ...] = ()  # model axis values added to the matrix's (`pcgh nightly`'s requested cards)
    executor: str = "local"  # "ray": each attempt a Ray task (ray_executor.py)
    address: str | None = None  # the Ray cluster's (None: one started on this machine, or $RAY_ADDRESS)


@dataclass
class Plan:
    """The matrix, its cells (cell.unsupported says why where the pre-check refused one) and the capability table
    they were checked against."""

    matrix: Matrix
    cells: list[Cell]
    caps: dict[str, Any]


def plan(matrix_path: str | Path, opts: RunOptions) -> Plan:
    """The cells a run takes; a filter, tier or matrix that selects none is a ConfigError (an empty run recorded
    as finished would pass a CI gate). A shard may be empty: a fixed CI split of a small matrix is not a typo."""
    matrix = load_matrix(matrix_path)
    matrix.axes.model.extend(m for m in dict.fromkeys(opts.extra_models) if m not in matrix.axes.model)
    cells = select(matrix, opts.filters, opts.tier, str(matrix_path))
    if opts.shard:
        cells = shard(cells, *opts.shard)
    caps = capabilities()
    cards: dict[str, ModelCard | None] = {}
    if opts.executor == "ray":  # a cell's GPUs are one node's: the pre-check weighs the cluster's largest
        from harness.launcher.ray_executor import connect, largest_node_gpus

        connect(opts.address, opts.jobs)
        caps["cuda_devices"], caps["gpu_host"] = largest_node_gpus(), "on the Ray cluster's largest node"
    elif matrix.defaults.device.startswith("cuda") and caps.get("cuda_devices"):
        caps.setdefault("cuda_memory_bytes", gpu_memory_bytes())  # what a cell's memory fit is checked against
    for cell in cells:
        cell.unsupported = precheck(cell, caps, cards)
    return Plan(matrix, cells, caps)


def gpu_memory_bytes() -> int | None:
    """The memory of this host's smallest visible GPU (a cell may be handed any of them); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
