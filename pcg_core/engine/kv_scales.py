"""Where an FP8 KV cache's per-layer scales come from: the checkpoint, or calibration.

A checkpoint that declares an FP8 KV cache carries k/v scales; the model loader puts them on the top-level model as
`pcg_kv_scales` ({decoder layer: (k_scale, v_scale)}, k ≈ k_fp8 · k_scale; MLA: both the latent's scale). A model
without them (synthetic weights) is calibrated as serving engines and quantizers do it: forwards with a 16-bit KV
cache over calibration prompts, each layer's absmax of K and of V recorded, scale = absmax / 448 (vLLM's
calculate_kv_scales takes absmax over a range constant on the first forward; ModelOpt's and llm-compressor's static
KV calibration amax / 448). The engine refuses an FP8 cache with no scales rather than guessing 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from pcg_core.attention.kv_cache import FP8_MAX, KVCache, KVScales, attention_layers, check_kv_scales
from pcg_core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ATTRIBUTE = "pcg_kv_scales"


class _Engine(Protocol):
    """What calibration needs of an Engine (engine.py imports this module, so it is named by shape)."""

    cache: KVCache

    def generate(self, prompts: list[list[int]], max_new_tokens: Any = ..., top_k: int = ...) -> list: ...


def kv_scales_of(model: PreTrainedModel, cache: KVCache | None = None) -> dict[int, tuple[float, float]]:
    """The model's KV scales, checked against `cache` (or the model's text config): every attention layer (a hybrid's
    linear-attention layers have no KV cache), positive finite, one per layer for MLA."""
    text = model.config.get_text_config()  # a VLM's text model: only it has a KV cache
    layers = len(cache.k) if cache is not None else text.num_hidden_layers
    attention = cache.attention_layers if cache is not None else attention_layers(text)
    latent = cache.latent if cache is not None else bool(getattr(text, "kv_lora_rank", None))
    scales = getattr(model, ATTRIBUTE, None)
    if scales is None:
        raise ConfigError("kv_cache fp8_e4m3 needs per-layer K/V scales and the model has none: the checkpoint declares "
                          f"no FP8 KV cache and nothing set `model.{ATTRIBUTE}`; calibrate them with "
                          "pcg_core.engine.kv_scales.calibrate_kv_scales (the cell runner does for synthetic weights) "
                          "or use kv_cache auto", field="kv_cache")
    check_kv_scales(scales, layers, latent, where=f"model.{ATTRIBUTE}", attention=attention)
    return {i: (float(scales[i][0]), float(scales[i][1])) for i in attention}


def scales_from_cache(cache: KVCache) -> dict[int, tuple[float, float]]:
    """absmax / 448 of each layer's K and V as a 16-bit cache holds them (the slots written; the pad slot left
    out). A layer with nothing in it gets 1."""
    if cache.quantized:
        raise ValueError("calibration reads a 16-bit KV cache; this one is FP8")
    out: dict[int, tuple[float, float]] = {}
    for i in cache.attention_layers:
        keys, values = cache.read(i)
        k, v = (float(t.abs().amax().float()) if t.numel() else 0.0 for t in (keys, values))
        if cache.latent:
            k = v = max(k, v)
        out[i] = (k / FP8_MAX if k > 0 else 1.0, v / FP8_MAX if v > 0 else 1.0)
    return out


@torch.no_grad()
def calibrate_kv_scales(engine: _Engine, prompts: list[list[int]],
                        max_new_tokens: int | Sequence[int] = 4) -> dict[int, tuple[float, float]]:
    """Per-layer KV scales from `engine` (a 16-bit KV cache, eager) run over `prompts`, prefill and decode, as the
    served model would fill its cache; set them on a model with `set_kv_scales`."""
    if engine.cache.quantized:
        raise ConfigError("calibrate KV scales on an engine with kv_cache auto (16-bit): an FP8 cache holds values "
                          "already clipped by the scales being computed", field="kv_cache")
    engine.generate(prompts, max_new_tokens, top_k=1)
    return scales_from_cache(engine.cache)


def set_kv_scales(model: PreTrainedModel, scales: KVScales) -> None:
    """Put checked scales on the model, where every engine built on it reads them (one per attention layer of its
    text model)."""
    text = model.config.get_text_config()
    check_kv_scales(scales, text.num_hidden_layers, bool(getattr(text, "kv_lora_rank", None)), where=ATTRIBUTE,
                    attention=attention_layers(text))
    setattr(model, ATTRIBUTE, {int(i): (float(k), float(v)) for i, (k, v) in scales.items()})
