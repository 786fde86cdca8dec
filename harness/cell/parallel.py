"""A parallel cell's process group: one process per rank, each running run_cell(spec) with torch's env://
variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), as the launcher or torchrun starts them;
each rank's part of the model; and the check of its eager against the same weights in one process."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from harness.cell.prompts import Case, run_case
from harness.cell.spec import CellSpec, resolve_model
from pcg_core.config import EngineConfig
from pcg_core.capture.registry import get_capture_backend
from pcg_core.distributed import ParallelGroup, env_world_size, init_from_env, shard_model
from pcg_core.distributed.data_parallel import data_parallel_model
from pcg_core.distributed.group import Mesh, mesh_groups
from pcg_core.distributed.pipeline import pipeline_model
from pcg_core.distributed.quant import emulate_row_shards, scheme_for_shards
from pcg_core.distributed.shard import shard_experts_by_index
from pcg_core.engine import Engine, SequenceOutput
from pcg_core.errors import ConfigError, UnsupportedModel
from pcg_core.known import parse_parallel, world_size
from pcg_core.model import load_model
from pcg_core.quant import get_scheme, quantize_model
from pcg_core.quant.synthetic_weights import make_realistic_

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def parallel_group(spec: CellSpec) -> ParallelGroup | None:
    """This rank's group for a parallel cell (None for tp1): the cell runs as one process per rank, each calling
    run_cell with the same spec and torch's env:// variables set (the launcher, or torchrun)."""
    ranks = world_size(spec.parallel)
    world = env_world_size()
    if ranks == 1 and world == 1:
        return None
    if world != ranks:
        raise ConfigError(f"parallel {spec.parallel} runs as {ranks} processes, one per rank; this one has WORLD_SIZE={world}: "
                          f"start the cell with `pcgh cell --parallel` or torchrun --nproc_per_node {ranks}", field="parallel")
    return init_from_env(spec.device)


def keep_rank_part(model: PreTrainedModel, group: ParallelGroup, spec: CellSpec) -> str | None:
    """Cut `model` (built whole, the same on every rank) down to this rank's part for parallel mode spec.parallel, in
    place. Pipeline stages (ppN alone, or each stage a group of its own running the rest of the mode: tp2-pp2 is two
    stages of TP2); within a stage: data-parallel attention with expert parallelism beside it (epN alone: each rank's
    experts reached by all-to-all dispatch, or, under a capture backend that records every op in one graph, by the
    all-gather form, whose shapes are static), tensor-parallel shards (tpN-epN: whole experts per rank), or both
    (tp2-dp2, tp2-ep4: TP attention in data-parallel groups). Returns how the experts are reached ("all_to_all",
    "all_gather", "all_reduce"; None: no experts spread)."""
    mode = parse_parallel(spec.parallel)
    stages = mode.get("pp", 1)
    if stages == group.size:
        pipeline_model(model, group)
        return None
    mesh = mesh_groups(group, stages, mode.get("tp", 1))
    dispatch = _stage_part(model, mesh, mode, spec.graph)
    if mesh.pipe is not None:
        pipeline_model(model, mesh.pipe)
    return dispatch


def _stage_part(model: PreTrainedModel, mesh: Mesh, mode: dict[str, int], graph: str) -> str | None:
    """keep_rank_part within one pipeline stage (the whole world where there is none)."""
    tp, ep, stage = mode.get("tp", 1), mode.get("ep", 1), mesh.stage
    if mesh.tp is not None and mesh.dp is not None:  # TP attention in DP groups; experts by TP, by TP group or over all
        if ep not in (1, tp, stage.size):
            raise UnsupportedModel(f"tp{tp}-ep{ep}: experts spread over {ep} of a stage's {stage.size} ranks (neither "
                                   f"the TP group's {tp} nor all of them) is not run yet")
        shard_model(model, mesh.tp, expert_parallel=ep > 1, expert_group=mesh.tp if ep == tp else stage)
        data_parallel_model(model, mesh.dp, gather_moe=True)
        return None if ep == 1 else "all_reduce" if ep == tp else "all_gather"
    if mode.get("dp", 1) > 1 or tp < ep:
        one_graph = bool(getattr(get_capture_backend(graph), "requires_capturable_attention"))  # full
        all_to_all = ep > 1 and not one_graph
        data_parallel_model(model, stage, gather_moe=not all_to_all)
        if ep > 1:
            shard_experts_by_index(model, stage, dispatch=all_to_all)
            return "all_to_all" if all_to_all else "all_gather"
        return None
    shard_model(model, stage, expert_parallel=ep > 1)
    return "all_reduce" if ep > 1 else None


def tp1_prompt_logprob_diff(full_model: PreTrainedModel, config: EngineConfig, case: Case,
                            sharded: list[SequenceOutput]) -> float:
    """Max |Δ prompt logprob| between the sharded model's eager outputs of `case` and the same full weights run
    eagerly in this one process (TP=1). Graph vs eager at the same TP cannot see a wrong shard or a missing
    collective (both sides share them), nor can the reference layer (its twin is a copy of the sharded model);
    this can. Prompt logprobs are teacher-forced, so a near-tie token flip does not make the two diverge."""
    engine = Engine(full_model, replace(config, capture=replace(config.capture, backend="disabled")))
    outs = run_case(engine, case, 1)
    worst = 0.0
    for a, b in zip(outs, sharded):
        worst = max([worst, *(abs(x - y) for x, y in zip(a.prompt_logprobs or [], b.prompt_logprobs or []))])
    return worst


def tp1_check(spec: CellSpec, config: EngineConfig, case: Case, sharded: list[SequenceOutput], tol: float,
              input_absmax: dict[str, float] | None) -> tuple[float, str | None]:
    """(max |Δ prompt logprob| of the sharded eager against the same weights unsharded in this process, why that is
    too far or None). A synthetic quantized model is quantized again here as the shards' full model was (same
    realistic scales, same calibration, same groups); where the shards round their activations per token over their
    own K, the unsharded model rounds them alike (emulate_row_shards), so only the sharding itself separates the two
    and the bound stays the cell's tolerance."""
    mode = parse_parallel(spec.parallel)
    parts = mode.get("tp", 1)
    lm = load_model(resolve_model(spec), layers=spec.layers, tiny=spec.tiny, weights=spec.weights,
                    dtype=config.torch_dtype, device=spec.device, seed=spec.seed, peaked=spec.peaked)
    if spec.quant != "none":
        if lm.synthetic:
            make_realistic_(lm.model, spec.seed)
            quantize_model(lm.model, scheme_for_shards(get_scheme(spec.quant), lm.model, parts), input_absmax=input_absmax)
        emulate_row_shards(lm.model, parts, experts=mode.get("ep", 1) == 1)  # tpN-epN: whole experts per rank
    diff = tp1_prompt_logprob_diff(lm.model, config, case, sharded)
    if diff <= tol:
        return diff, None
    return diff, (f"{spec.parallel} eager differs from tp1 eager (the same weights unsharded) by {diff:.3g} in prompt "
                  f"logprob > {tol:g} on {case.name}: a shard or a collective is wrong")
