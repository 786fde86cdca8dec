"""A parallel cell's process group: one process per rank, each running run_cell(spec) with torch's env://
variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), as the launcher or torchrun starts them;
and the check of its eager against the same weights in one process."""

from __future__ import annotations

from dataclasses import replace

import torch

from harness.cell.prompts import Case
from harness.cell.spec import CellSpec
from pcg_core.config import EngineConfig
from pcg_core.distributed import ParallelGroup, env_world_size, init_from_env
from pcg_core.engine import Engine, SequenceOutput
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


def tp1_prompt_logprob_diff(full_model: torch.nn.Module, config: EngineConfig, case: Case,
                            sharded: list[SequenceOutput]) -> float:
    """Max |Δ prompt logprob| between the sharded model's eager outputs of `case` and the same full weights run
    eagerly in this one process (TP=1). Graph vs eager at the same TP cannot see a wrong shard or a missing
    collective (both sides share them), nor can the reference layer (its twin is a copy of the sharded model);
    this can. Prompt logprobs are teacher-forced, so a near-tie token flip does not make the two diverge."""
    engine = Engine(full_model, replace(config, capture=replace(config.capture, backend="disabled")))
    outs = engine.generate([list(p) for p in case.prompts], case.new_tokens, 1, prompt_logprobs=True, chunk=case.chunk)
    worst = 0.0
    for a, b in zip(outs, sharded):
        worst = max([worst, *(abs(x - y) for x, y in zip(a.prompt_logprobs or [], b.prompt_logprobs or []))])
    return worst
