"""Is eager's padding exact? The float32 test that tells padding noise from a padding leak.

In half precision eager padded to a bucket and eager unpadded differ: a padded GEMM rounds differently, and on a
MoE model one such rounding can flip a router's choice of experts, which moves a logprob by a whole unit (gpt-oss
×2 on the H200: 0.97). The judge widens its bound on graph vs *unpadded* eager to that measured difference. A
padding *leak* — padding rows reaching real ones, in the model or the attention backend — would widen it just the
same and hide itself. Rounding and a leak part in float32: there the same forwards differ by ~1e-6 from rounding,
while a leak keeps its size. So the noisy cases run again on the model in float32, padded as the graph pads
and unpadded, and only a padding shown exact there counts as noise. The float32 model is the float twin
(pcg_core/quant/twin.py: it shares the model's weights, reading them in float32; a quantized model's weights
dequantized, no activation quantizer): quantizers turn a 1e-7 rounding change into a whole step, in float32 too,
while each of them is row-local, so padding cannot leak through them.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import replace

import torch

from harness.cell.diagnose import lockstep_stats, nan_max
from harness.cell.prompts import Case
from pcg_core.config import EngineConfig
from pcg_core.engine import Engine, PackedBatch
from pcg_core.quant.twin import float_twin

# Max per-row relative difference of hidden states, float32 eager padded vs unpadded, for padding to count as
# exact: GEMM summation orders differ by ~1e-7 relative per op; a leak of a padding row at 1e-4 of a real row's
# size is already far below anything half precision can show.
FP32_PADDING_RTOL = 1e-4


class _PaddedEager:
    """An eager engine standing in for the graph engine in the lockstep: it pads each forward to the graph's bucket,
    so the lockstep's noise runs (unpadded, padded) happen in float32 with the graph's shapes."""

    def __init__(self, engine: Engine, bucket_for: Callable[[int], int | None]):
        self.engine, self.bucket_for = engine, bucket_for

    def pack_prompts(self, prompts: list[list[int]], new_tokens: int, images=None):
        return self.engine.pack_prompts(prompts, new_tokens, images)

    def forward(self, batch: PackedBatch, observer=None, decode: bool = False) -> torch.Tensor:
        return self.engine.forward(batch, eager=True, observer=observer, pad_to=self.bucket_for(len(batch)))


@torch.no_grad()
def float32_padding_rel(model: torch.nn.Module, config: EngineConfig, bucket_for: Callable[[int], int | None],
                        cases: list[Case]) -> float:
    """Worst per-row relative difference of any forward's hidden states in `cases`, eager padded to `bucket_for`'s
    buckets vs unpadded, on `model`'s float twin (float32, sharing its weights) with `config`'s attention backend
    and KV capacity (NaN if a row is NaN). The twin is freed before returning; the caller's model is not touched."""
    model32 = float_twin(model)
    try:
        # A 16-bit KV cache: an FP8 one's static per-tensor scales are row-local (padding cannot leak through them),
        # and its rounding steps would turn float32's 1e-7 into whole steps, as activation quantizers do.
        cfg = replace(config, dtype="float32", kv_cache="auto", capture=replace(config.capture, backend="disabled"))
        ref, other = Engine(model32, cfg), Engine(model32, cfg)
        return nan_max(lockstep_stats(ref, _PaddedEager(other, bucket_for), case, noise=True).padding_rel for case in cases)
    finally:
        ref = other = model32 = None  # engines and twin hold reference cycles (capture backend, bound forwards)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
