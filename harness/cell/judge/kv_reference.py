"""The reference layer's view of an FP8 KV cache: transformers' forward with K and V rounded as the cache holds them.

pcg's eager run with `kv_cache=fp8_e4m3` differs from a 16-bit forward by the cache's own rounding (a few percent
per value, up to a nat of logprob on synthetic weights), far past the bounds the reference layer holds eager to.
So the transformers twin it is compared with rounds K and V the same way, in plain math at its attention call:
x → clamp(x / scale, ±448) as FP8 e4m3 → × scale, with the scales pcg's engine read (the checkpoint's or the
calibrated ones; MLA: the latent row, its normed compressed KV and its rotated key part, before they are expanded).
None of pcg's cache, backends or dequantization runs here, so a runtime that quantizes with one scale and reads
with another, or forgets the scale on read, lands far from this reference while graph = eager holds.
The noise that sets the bounds is measured the same way as for any cell: this twin in the cell's dtype (or with
transformers' other attention) against itself in float32, rounding K and V with the same scales. In half precision
that noise holds the FP8 roundings that land elsewhere (a bf16 K is 2^-9 from float32's: ~3% of values round to the
other neighbour). In float32, implementations 1e-7 apart land a value on the other side of an FP8 step only by
chance, and the other attention need not land one: pcg's eager once sat 1.02e-3 from the reference with a noise of
7.6e-6 (Qwen2.5-VL tiny × fp8_block, CI). Turning FP8 roundings at random was tried and dropped: one turned value per
K or V tensor widened the max bound to whole nats (0.7–4.4 on the tiny models), a bound that would hold nothing. What
the float32 noise twin does instead (`turn`): it rounds the other way exactly the values chance could turn — those
within `AMBIGUOUS` (relative) of the midpoint between their two FP8 neighbours — and no other. That set is what a
summation-order difference reaches, so the bound covers any chance subset of it and stays a rounding's width.

Chance turns that band does not reach still happen (pcg's float32 differs from transformers' by more than 1e-6 at a
later layer, or on a small value): chance twins (float32 cells only) turn every value within a wider band of a
midpoint (CHANCE_TWINS), and the reference layer judges each position past NOISE_MULT × what they move it by. A
turned rounding moves a few positions by up to that; a fault moves every position.

Registered with transformers as attention implementations `pcg_fp8kv_sdpa` and `pcg_fp8kv_eager` (masks as sdpa's
and eager's): the twin's modules call them as they call their own, and each reads its layer's scales from the
module (`pcg_ref_kv_scale`), set on the twin only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from harness.metrics import CheckpointKvScales
from pcg_core.model.mla import is_mla_attention

PREFIX = "pcg_fp8kv_"
FP8_E4M3_MAX = 448.0
SCALE_ATTRIBUTE = "pcg_ref_kv_scale"
TURN_ATTRIBUTE = "pcg_ref_kv_turn"
# How near the midpoint between two FP8 neighbours (relative to the value) a K or V value must sit for a float32
# summation-order difference to land it on either side. Calibrated on the CPU (Qwen3 tiny, sdpa and flex, seeds 0-1,
# 16-bit and fp8_block): pcg's eager showed a turned rounding (max |Δlogprob| 1.6e-4 to 5.9e-4 over a 4e-6 floor) in
# 3 of 6 runs; a noise twin turning within 1e-7 landed one in 1 of 6, within 1e-6 in 3 of 6 (its max bound then
# 0.010-0.047, the mean bound ≤ 5.2e-4); within 1e-5 every run, with max bounds of whole tenths. 1e-6 (~8 float32
# ulps) turns a superset of what pcg's own order turns, and ~3 values in 10^5.
AMBIGUOUS = 1e-6
# The chance twins (float32 cells only): each turns every value within its band of an FP8 midpoint (relative to
# the value, or to the larger of the value and its row's RMS: a summation order's error scales with the row, so a
# small value is turned from further). Position by position, the larger of what they move it by is what a chance
# turn can do there, for the rare turn of pcg's own that the noise twin's band did not reach (a float32 difference
# past 1e-6 at a later layer, or on a small value); reference.py judges each position past NOISE_MULT × that, the
# mean too (a turned value's KV moves later positions a little). Two twins, not one: a twin turns many values at
# once, and their effects at a position can cancel where pcg's one turn does not. Over the CPU smoke matrix × 20
# seeds (benchmarks/results/2026-12-06d-cpu-fp8-kv-seeds/): 14 of 960 runs failed for such a turn with no chance
# twin (max |Δlogprob| 1e-3 to 0.3 at 1-12 positions); either twin alone left one to three of them; both, none.
# Planted faults that eager and graph share (a truncating quantizer, a scale 12.5% off on read, a forgotten scale)
# move the mean 0.2-4.7 past chance, against mean bounds of 1e-4 to 3e-2.
CHANCE_TWINS = ((1e-5, False), (3e-5, True))  # (band, relative to the row's RMS too)
# The eager attention function each model's module calls under "eager" (transformers' modeling modules; Grok's own).
_EAGER_FUNCTIONS = ("eager_attention_forward", "grok_eager_attention")


def fake_quant(x: torch.Tensor, scale: float, turn: float = 0.0, row: bool = False) -> torch.Tensor:
    """x as an FP8 e4m3 cache with this per-tensor scale gives it back, in x's dtype. `turn`: values within that
    distance of a rounding midpoint, relative to the value (`row`: to the larger of the value and its row's RMS: a
    summation order's error scales with the row, so a small value is turned from further), go to their other
    neighbour (AMBIGUOUS: the float32 noise twin's rounding; CHANCE_TWINS: the chance twins')."""
    s = torch.tensor(scale, dtype=torch.float32, device=x.device)
    y = (x.float() / s).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    q = y.to(torch.float8_e4m3fn).float()
    if turn:  # y near the midpoint of q and its other neighbour n: 2y - q is near n, and rounds to it
        n = (2 * y - q).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()
        size = torch.maximum(y.abs(), y.pow(2).mean(-1, keepdim=True).sqrt()) if row else y.abs()
        q = torch.where((n != q) & ((y - (q + n) / 2).abs() <= turn * size), n, q)
    return (q * s).to(x.dtype)


def _base_function(base: str, module: torch.nn.Module):
    if base == "sdpa":
        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    modeling = sys.modules[type(module).__module__]
    for name in _EAGER_FUNCTIONS:
        if (fn := getattr(modeling, name, None)) is not None:
            return fn
    raise RuntimeError(f"{type(module).__module__} has no eager attention function ({', '.join(_EAGER_FUNCTIONS)}) "
                       "for the FP8 KV-cache reference to call")


def _fp8_kv_attention(base: str):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        k_scale, v_scale = getattr(module, SCALE_ATTRIBUTE)
        turn, row = getattr(module, TURN_ATTRIBUTE, (0.0, False))
        if is_mla_attention(module):
            # The latent's compressed part was rounded at kv_a_layernorm (the hook below), so keys' expanded
            # no-rope part and the values follow from it; the rotated shared key part is rounded here.
            nope = module.qk_nope_head_dim
            key = torch.cat([key[..., :nope], fake_quant(key[..., nope:], k_scale, turn, row)], dim=-1)
        else:
            key, value = fake_quant(key, k_scale, turn, row), fake_quant(value, v_scale, turn, row)
        return _base_function(base, module)(module, query, key, value, attention_mask, *args, **kwargs)

    return attention


for _base in ("sdpa", "eager"):
    AttentionInterface.register(PREFIX + _base, _fp8_kv_attention(_base))
    AttentionMaskInterface.register(PREFIX + _base, ALL_MASK_ATTENTION_FUNCTIONS[_base])


def _round_latent(scale: float, turn: float, row: bool):
    def hook(module: torch.nn.Module, args, out: torch.Tensor) -> torch.Tensor:
        return fake_quant(out, scale, turn, row)

    return hook


def round_kv(twin: torch.nn.Module, attention: str, scales: Mapping[int, tuple[float, float]], turn: float = 0.0,
             row: bool = False) -> str:
    """Make transformers' twin round K and V as an FP8 cache with `scales` does (`turn`, `row`: the values that near
    a midpoint the other way, fake_quant); returns the attention implementation to set on its config (`attention`'s
    FP8 twin)."""
    for module in twin.modules():
        layer = getattr(module, "layer_idx", None)
        if layer is None or not hasattr(module, "o_proj"):
            continue
        k_scale, v_scale = (float(x) for x in scales[layer])
        setattr(module, SCALE_ATTRIBUTE, (k_scale, v_scale))
        setattr(module, TURN_ATTRIBUTE, (turn, row))
        if is_mla_attention(module):
            module.get_submodule("kv_a_layernorm").register_forward_hook(_round_latent(k_scale, turn, row))
    return PREFIX + attention


def text_only(config, implementation: str, others: str) -> str | dict[str, str]:
    """`implementation` for the text model's attention, `others` for every other sub-model's (a VLM's vision
    tower: it has no KV cache, so nothing to round and no scales), in the form transformers' config setter takes
    (a dict keyed by sub-config, "" the top level); a text-only config gets `implementation` itself."""
    subs = [k for k in getattr(config, "sub_configs", None) or {} if getattr(config, k, None) is not None]
    if "text_config" not in subs:
        return implementation
    return {"": implementation, **{k: implementation if k == "text_config" else others for k in subs}}


def checkpoint_kv_scales(model: torch.nn.Module) -> CheckpointKvScales | None:
    """What the loader read of a declared FP8 KV cache (the model's `pcg_kv_scales`, pcg_core/quant/formats/kv_scales.py),
    for the record; None when the checkpoint declares none."""
    scales = getattr(model, "pcg_kv_scales", None)
    if not scales:
        return None
    k, v = [s[0] for s in scales.values()], [s[1] for s in scales.values()]
    return CheckpointKvScales(layers=len(scales), k_min=min(k), k_max=max(k), v_min=min(v), v_max=max(v), applied=False)
