"""Pipeline parallelism at run time: each rank runs a contiguous stage of the decoder layers, the hidden state handed
from stage to stage by `pcg::pipeline_pass_`, a split op that graphs never record (send and receive run between the
graphs, as vLLM runs them: a collective whose peer is in another graph would pair with nothing).

Every rank runs one program, the whole model's: layers outside its stage are skipped (they return their input), and
the layer that ends stage i passes its output from rank i to rank i+1, which writes it over its own (skipped) stream.
The last layer's output is broadcast from the last stage to every rank, so that each computes the same norm, head and
logits and picks the same next tokens: the ranks' batches, buckets and capture modes stay identical by construction
(the split-brain hang of vllm-project/vllm#45094 needs ranks that disagree on them). Skipped layers keep their
weights and KV pages for now (memory per rank is the whole model's). PP eager equals TP1 eager bit for bit: the same
operations on the same rows in the same order, only on other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pcg_core.distributed.group import ParallelGroup, get_group
from pcg_core.errors import UnsupportedModel
from pcg_core.split_ops import register_split_op, run_split_op

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ATTRIBUTE = "pcg_pipeline_parallel"  # on the staged model: its PipelineParallel record
BROADCAST = -1  # pipeline_pass_'s dst for "every rank"
_SKIPPED, _PASS, _GROUP = "pcg_pp_skipped", "pcg_pp_pass", "pcg_pp_group"


def _pipeline_pass(x: torch.Tensor, group: str, src: int, dst: int) -> None:
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("pcg::pipeline_pass_ runs between graphs: a send recorded in one rank's graph pairs with "
                           "nothing (full capture of a pipeline-parallel model is refused for this reason)")
    g = get_group(group)
    rank = dist.get_rank(g)
    if dst == BROADCAST:
        dist.broadcast(x, src=dist.get_global_rank(g, src), group=g)
    elif rank == src:
        dist.send(x.contiguous(), dst=dist.get_global_rank(g, dst), group=g)
    elif rank == dst:
        got = torch.empty_like(x, memory_format=torch.contiguous_format)
        dist.recv(got, src=dist.get_global_rank(g, src), group=g)
        x.copy_(got)


@torch.library.custom_op("pcg::pipeline_pass_", mutates_args=("x",))
def pipeline_pass_(x: torch.Tensor, group: str, src: int, dst: int) -> None:
    """x of rank `src` of `group` written over x of rank `dst` (BROADCAST: of every rank); other ranks untouched."""
    run_split_op(_pipeline_pass, x, group, src, dst)


@pipeline_pass_.register_fake
def _pipeline_pass_fake(x, group, src, dst) -> None:
    return None


register_split_op(torch.ops.pcg.pipeline_pass_, capturable=False)


@dataclass(frozen=True)
class PipelineParallel:
    """What staging did: the group, this rank's layers [first, end), and every stage's bounds."""

    group: ParallelGroup
    first: int
    end: int
    bounds: tuple[tuple[int, int], ...]


def stage_bounds(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Contiguous [first, end) per stage, as even as the count allows (the earlier stages take the remainder)."""
    if stages > layers:
        raise UnsupportedModel(f"pp{stages}: the model has {layers} decoder layer(s), fewer than its {stages} stages")
    size, extra = divmod(layers, stages)
    bounds, first = [], 0
    for i in range(stages):
        end = first + size + (i < extra)
        bounds.append((first, end))
        first = end
    return tuple(bounds)


_STAGED_CLASSES: dict[type, type] = {}


def _staged_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of decoder-layer class `cls` that skips the layer where this rank does not own it and hands its
    output on where it ends a stage (attributes set per module). One subclass per class, reused."""
    if cls not in _STAGED_CLASSES:
        def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
            out = hidden_states if getattr(self, _SKIPPED) else cls.forward(self, hidden_states, *args, **kwargs)
            if (hop := getattr(self, _PASS)) is not None:
                torch.ops.pcg.pipeline_pass_(out[0] if isinstance(out, tuple) else out, getattr(self, _GROUP), *hop)
            return out

        _STAGED_CLASSES[cls] = type(f"Staged{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})
    return _STAGED_CLASSES[cls]


def _decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise UnsupportedModel(f"pp: {type(model).__name__}'s decoder has no `layers` list to split into stages")
    return layers


def pipeline_model(model: PreTrainedModel, group: ParallelGroup) -> PipelineParallel:
    """Stage `model` (built whole, the same weights on every rank) for `group` in place, one stage per rank; returns
    the record, also set on the model as `pcg_pipeline_parallel`."""
    if getattr(model, ATTRIBUTE, None) is not None:
        raise ValueError(f"{type(model).__name__} is already staged (pcg_pipeline_parallel is set); stage a model once")
    layers = _decoder_layers(model)
    bounds = stage_bounds(len(layers), group.size)
    first, end = bounds[group.rank]
    last = group.size - 1
    for i, layer in enumerate(layers):
        setattr(layer, _SKIPPED, not first <= i < end)
        stage = next(s for s, (a, b) in enumerate(bounds) if a <= i < b)
        hop = None
        if i == len(layers) - 1:
            hop = (last, BROADCAST)
        elif i == bounds[stage][1] - 1:
            hop = (stage, stage + 1)
        setattr(layer, _PASS, hop)
        setattr(layer, _GROUP, group.name)
        layer.__class__ = _staged_class(type(layer))
    record = PipelineParallel(group=group, first=first, end=end, bounds=bounds)
    setattr(model, ATTRIBUTE, record)
    return record


def pipeline_parallel_of(model: torch.nn.Module) -> PipelineParallel | None:
    return getattr(model, ATTRIBUTE, None)
