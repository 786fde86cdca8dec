"""The process group of a parallel cell, set up from torch's env:// variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) as a launcher or torchrun sets them: gloo on a CPU, NCCL on CUDA.

Collectives name their group by a string (a custom op cannot take a ProcessGroup, and Dynamo bakes the string
into the graph as a constant), so each group set up here is registered under torch's own group name.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from pcg_core.errors import ConfigError

_GROUPS: dict[str, dist.ProcessGroup] = {}
# A rank that waits longer than this in a collective is hung (its peer crashed): the launcher's timeout ends the cell,
# but a bounded wait lets gloo raise first, with the collective named.
TIMEOUT = timedelta(seconds=int(os.environ.get("PCG_DIST_TIMEOUT_S", "300")))


@dataclass(frozen=True)
class ParallelGroup:
    """One tensor-parallel group: this process's rank in it, its size, and the name collectives use."""

    rank: int
    size: int
    name: str
    backend: str


def rank_block(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/size of `t` along `dim`, as a tensor of its own (every sharder's one slicing; the
    caller checks that size divides it)."""
    step = t.shape[dim] // size
    return t.narrow(dim, rank * step, step).clone().contiguous()


def env_world_size() -> int:
    """WORLD_SIZE from the environment (1 when unset: a plain single process)."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        n = int(raw)
    except ValueError as e:
        raise ConfigError(f"WORLD_SIZE={raw!r} is not an integer; the launcher sets it to the number of ranks") from e
    if n < 1:
        raise ConfigError(f"WORLD_SIZE={n}: must be ≥ 1")
    return n


def rank_device(device: str) -> str:
    """The device this rank runs on: `cuda` becomes cuda:LOCAL_RANK where this process sees several GPUs (a
    launcher that narrows CUDA_VISIBLE_DEVICES to one GPU per rank leaves cuda:0); anything else as given."""
    if device != "cuda" or env_world_size() == 1:
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return f"cuda:{local}" if torch.cuda.device_count() > 1 else "cuda:0"


def init_from_env(device: str) -> ParallelGroup | None:
    """The world group of this process (set up once, from env://), or None in a single process. NCCL on CUDA,
    gloo on a CPU: the backend follows the device the cell runs on, as transformers' TP does."""
    world = env_world_size()
    if world == 1:
        return None
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE={world} but {', '.join(missing)} unset: a parallel cell's ranks are started by "
                          "the launcher (pcgh cell --parallel) or torchrun, which set torch's env:// variables")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(torch.device(rank_device(device)))
        # Dynamo imported after the group is made (a model's first transformers import does it) keeps the group
        # alive past destroy_process_group (measured on torch 2.13): its gloo threads then live into the interpreter's
        # finalization, where one releasing a tensor aborts the rank ("terminate called without an active
        # exception") after its work is done. Imported first, destroy frees the group.
        importlib.import_module("torch._dynamo")  # not `import torch._dynamo`: that would make `torch` local here
        dist.init_process_group(backend=backend, init_method="env://", timeout=TIMEOUT)
    world_group = dist.group.WORLD
    assert world_group is not None  # initialized above
    return register_group(world_group)


def register_group(group: dist.ProcessGroup) -> ParallelGroup:
    """Make `group` (set up by the caller: the world, or a world of one on a single GPU) reachable by name from
    pcg::all_reduce_, and describe it."""
    name = group.group_name
    _GROUPS[name] = group
    return ParallelGroup(rank=dist.get_rank(group), size=dist.get_world_size(group), name=name,
                         backend=dist.get_backend(group))


@dataclass(frozen=True)
class Mesh:
    """This rank's groups in a world laid out pipeline stage by stage, and inside a stage data-parallel group by
    group of consecutive tensor-parallel ranks (rank = stage·n + d·tp + t, n ranks a stage: PP outermost and TP
    innermost, as vLLM and Megatron lay them out). `stage`: the ranks of this rank's stage (the world without PP);
    `pipe`: the ranks at its place in every stage (the hand-off), None without PP; `tp` and `dp`: within the stage,
    this rank's TP ranks and the ranks at its place in every TP group, None unless the stage has both (tp2-dp2)."""

    stage: ParallelGroup
    pipe: ParallelGroup | None = None
    tp: ParallelGroup | None = None
    dp: ParallelGroup | None = None


def mesh_groups(world: ParallelGroup, stages: int, tp: int) -> Mesh:
    """The Mesh of this rank for `stages` pipeline stages of TP degree `tp`. Every rank makes every group, in one
    order, as torch's new_group requires (a rank that made only its own would hang the others); each is registered
    by name like the world."""
    if stages < 1 or world.size % stages or (world.size // stages) % tp:
        raise ValueError(f"{stages} pipeline stages of tp{tp} do not divide a world of {world.size} ranks")
    n = world.size // stages
    dps = n // tp

    def make(ranks: list[list[int]]) -> ParallelGroup:
        mine, _ = dist.new_subgroups_by_enumeration(ranks, timeout=TIMEOUT)
        return register_group(mine)

    mesh = Mesh(stage=world)
    if stages > 1:
        mesh = Mesh(stage=make([[s * n + j for j in range(n)] for s in range(stages)]),
                    pipe=make([[s * n + j for s in range(stages)] for j in range(n)]))
    if tp > 1 and dps > 1:
        mesh = replace(mesh, tp=make([[s * n + d * tp + t for t in range(tp)] for s in range(stages) for d in range(dps)]),
                       dp=make([[s * n + d * tp + t for d in range(dps)] for s in range(stages) for t in range(tp)]))
    return mesh


def get_group(name: str) -> dist.ProcessGroup:
    """The group registered under `name` (init_from_env); a KeyError names the registered ones."""
    try:
        return _GROUPS[name]
    except KeyError:
        raise KeyError(f"no process group {name!r} set up in this process (have: {', '.join(_GROUPS) or 'none'}); "
                       "pcg_core.distributed.init_from_env sets up the world group") from None


def shutdown() -> None:
    """Tear the process group down (a rank's last act: NCCL warns about a group left to the interpreter's exit)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    _GROUPS.clear()
