"""FP8 KV-cache scales in checkpoints: the declaration, the per-layer k/v scales, read and checked at load, and
written by the synthetic-checkpoint writers.

What the producers write (ModelOpt's export, compressed-tensors' attention quantization, as vLLM/SGLang load them):

- ModelOpt declares `kv_cache_quant_algo: "FP8"` in hf_quant_config.json's `quantization` (other values it writes:
  NVFP4, NVFP4_AFFINE, INT8, FP8_K_NVFP4_V), or in config.json's quantization_config (its compressed-tensors-style
  layout) `kv_cache_scheme: {"dynamic": false, "num_bits": 8, "type": "float"}` (other algos as the bare string).
  Its tensors are `<attention>.k_proj.k_scale` and `<attention>.v_proj.v_scale`, float32 scalars: the calibrated
  K/V absmax / 448 (ModelOpt clamps FP8 ones to at least 1.0). MLA models get the same names (the export renames
  the attention module's k/v quantizers by suffix), though they have no k_proj.
- compressed-tensors declares `kv_cache_scheme` (QuantizationArgs: num_bits 8, type float, strategy tensor,
  dynamic false, symmetric true) and stores `<attention>.k_scale` / `<attention>.v_scale`, shape [1], in the
  model's dtype.

Both are dequantization multipliers: k ≈ k_fp8 · k_scale. An MLA model caches one latent row per token, read as
both K and V; vLLM writes and reads it with k_scale, so its (k, v) pair here is (k_scale, k_scale).
With the KV cache in the model dtype (the default) the scales are unused: they are still read and checked, so a
checkpoint whose scales are broken is refused rather than loaded with them silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.formats.files import CheckpointTensors

FP8_E4M3_MAX = 448.0
MODELOPT_KV_SCALES = (".k_proj.k_scale", ".v_proj.v_scale")
CT_KV_SCALES = (".k_scale", ".v_scale")
READ_TODAY = ("what is read today: an FP8 (e4m3) KV cache with one k and one v scale per attention layer (ModelOpt "
              "kv_cache_quant_algo FP8; compressed-tensors kv_cache_scheme num_bits 8, type float, strategy tensor, "
              "static, symmetric); its scales are read and checked, and the KV cache runs in the model dtype")
# ModelOpt's config.json layout for an FP8 KV cache (convert_hf_quant_config_format), and compressed-tensors'
# QuantizationArgs for it as its model_dump writes them.
MODELOPT_FP8_KV_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}
CT_FP8_KV_SCHEME = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": "tensor",
                    "dynamic": False}


@dataclass(frozen=True)
class KvCacheSpec:
    """A checkpoint's FP8 KV-cache declaration: where it is and how it was spelled (for messages and records)."""

    where: str
    declared: str
    algo: str = "fp8_e4m3"


def _refuse(where: str, what: str) -> UnsupportedModel:
    return UnsupportedModel(f"{where}: {what}; {READ_TODAY}")


def _none(value: Any) -> bool:
    return value in (None, "", "none", "NONE", "None", {})


def modelopt_kv_cache(q: dict[str, Any], where: str) -> KvCacheSpec | None:
    """The FP8 KV cache a ModelOpt declaration (hf_quant_config.json's `quantization`, or config.json's
    quantization_config) asks for, or None; any other KV-cache algorithm is refused by name."""
    algo, scheme = q.get("kv_cache_quant_algo"), q.get("kv_cache_scheme")
    if not _none(algo):
        if algo != "FP8":
            raise _refuse(where, f"ModelOpt kv_cache_quant_algo {algo!r} is not read")
        if not _none(scheme) and scheme not in ("FP8", MODELOPT_FP8_KV_SCHEME):
            raise _refuse(where, f"kv_cache_quant_algo 'FP8' but kv_cache_scheme {scheme!r}: the two disagree")
        return KvCacheSpec(where, "kv_cache_quant_algo 'FP8'")
    if _none(scheme):
        return None
    if scheme == "FP8":
        return KvCacheSpec(where, "kv_cache_scheme 'FP8'")
    if isinstance(scheme, dict):
        return ct_kv_cache(scheme, where, producer="ModelOpt")
    raise _refuse(where, f"ModelOpt kv_cache_scheme {scheme!r} is not read")


def ct_kv_cache(scheme: Any, where: str, producer: str = "compressed-tensors") -> KvCacheSpec | None:
    """The FP8 KV cache a `kv_cache_scheme` (compressed-tensors QuantizationArgs, its defaults filled in: type int,
    symmetric, static, strategy tensor) asks for, or None; anything else is refused naming what differs."""
    if _none(scheme):
        return None
    if not isinstance(scheme, dict):
        raise _refuse(where, f"{producer} kv_cache_scheme {scheme!r} is not a mapping")
    got = {"num_bits": scheme.get("num_bits"), "type": scheme.get("type", "int"),
           "strategy": scheme.get("strategy") or ("group" if scheme.get("group_size") else "tensor"),
           "dynamic": scheme.get("dynamic", False), "symmetric": scheme.get("symmetric", True)}
    want = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    bad = {k: v for k, v in got.items() if v != want[k]}
    if bad:
        raise _refuse(where, f"{producer} kv_cache_scheme with {bad} is not read")
    return KvCacheSpec(where, "kv_cache_scheme FP8 (num_bits 8, float, per tensor)")


def attention_modules(model: torch.nn.Module) -> dict[int, tuple[str, bool]]:
    """{decoder layer index: (attention module name, whether it is MLA)}: every `self_attn` that has a KV cache (a
    hybrid model's linear-attention layers have none, and no scales)."""
    out = {}
    for name, mod in model.named_modules():
        if name.endswith("self_attn") and isinstance(getattr(mod, "layer_idx", None), int):
            out[mod.layer_idx] = (name, hasattr(mod, "kv_lora_rank"))
    return dict(sorted(out.items()))


def _scale(tensors: CheckpointTensors, key: str) -> float:
    """The scale `key` as a float: one element, floating point, finite and positive, or an error naming it and its
    file."""
    t = tensors.get(key)
    where = f"{tensors.path}/{tensors.file_of(key)}: {key}"
    if t.numel() != 1 or t.dim() > 1:
        raise UnsupportedModel(f"{where} has shape {tuple(t.shape)}; a KV-cache scale is one number per tensor (shape () "
                               "or [1]); per-head or per-channel KV scales are not read")
    if not t.dtype.is_floating_point or t.dtype.itemsize < 2:
        raise UnsupportedModel(f"{where} is {t.dtype}; KV-cache scales are float32, bfloat16 or float16")
    v = float(t.float())
    if not math.isfinite(v) or v <= 0:
        raise UnsupportedModel(f"{where} is {v:.6g}; a KV-cache scale must be finite and positive (the checkpoint's "
                               "calibration is broken: re-export it)")
    return v


def _pick(tensors: CheckpointTensors, prefix: str, suffixes: tuple[str, str]) -> str | None:
    found = [prefix + s for s in suffixes if prefix + s in tensors]
    if len(found) > 1:
        raise UnsupportedModel(f"{tensors.path}: both {found[0]} and {found[1]} are there: one KV-cache scale per "
                               "tensor and layer, in ModelOpt's or compressed-tensors' naming, not both")
    return found[0] if found else None


def read_kv_scales(model: torch.nn.Module, tensors: CheckpointTensors, spec: KvCacheSpec,
                   file_key: Callable[[str], str] = str) -> dict[int, tuple[float, float]]:
    """{decoder layer index: (k_scale, v_scale)} of every attention layer the model keeps, read from `tensors`
    (which then counts them used) in either producer's naming; `file_key` maps a module name
    to the files' spelling. A layer without both is an error naming the tensor that is missing."""
    out = {}
    for idx, (name, mla) in attention_modules(model).items():
        prefix = file_key(name)
        k = _pick(tensors, prefix, (MODELOPT_KV_SCALES[0], CT_KV_SCALES[0]))
        v = _pick(tensors, prefix, (MODELOPT_KV_SCALES[1], CT_KV_SCALES[1]))
        if k is None or v is None:
            missing = " and ".join(f"{prefix}{a} (or {prefix}{b})" for a, b, got in
                                   ((MODELOPT_KV_SCALES[0], CT_KV_SCALES[0], k), (MODELOPT_KV_SCALES[1], CT_KV_SCALES[1], v))
                                   if got is None)
            have = f"; {k or v} is there" if (k or v) else ""
            if f"{prefix}.k_proj.output_scale" in tensors:  # llm-compressor before its attention quantization
                have += f"; {prefix}.k_proj.output_scale (older compressed-tensors' naming) is not read"
            raise UnsupportedModel(f"{tensors.path}: {spec.where} declares an FP8 KV cache ({spec.declared}) but layer "
                                   f"{idx}'s {missing} is missing{have}: every attention layer needs its k and v scale")
        ks, vs = _scale(tensors, k), _scale(tensors, v)
        out[idx] = (ks, ks) if mla else (ks, vs)
    return out


# Writing -------------------------------------------------------------------------------------------------------
def declare_kv_cache(fmt: str, qc: dict | None, legacy_cfg: dict | None) -> tuple[dict | None, dict | None]:
    """(config.json quantization_config, hf_quant_config.json) with an FP8 KV cache declared as `fmt`'s producer
    declares it."""
    if fmt == "modelopt" and legacy_cfg is not None:
        legacy_cfg = {**legacy_cfg, "quantization": {**legacy_cfg["quantization"], "kv_cache_quant_algo": "FP8"}}
    elif fmt == "modelopt":
        assert qc is not None  # modelopt declares in config.json when it has no hf_quant_config.json
        qc = {**qc, "kv_cache_scheme": dict(MODELOPT_FP8_KV_SCHEME)}
    elif fmt == "compressed-tensors":
        assert qc is not None  # compressed-tensors always declares in config.json
        qc = {**qc, "kv_cache_scheme": dict(CT_FP8_KV_SCHEME)}
    else:
        raise ValueError(f"no FP8 KV-cache declaration for format {fmt!r} here (modelopt and compressed-tensors have one)")
    return qc, legacy_cfg


def kv_scale_tensors(model: torch.nn.Module, fmt: str, scales: dict[int, tuple[float, float]],
                     file_key: Callable[[str], str] = str) -> dict[str, torch.Tensor]:
    """The k/v scale tensors of every attention layer, named, shaped and typed as `fmt`'s producer writes them."""
    layers = attention_modules(model)
    if set(scales) != set(layers):
        raise ValueError(f"KV scales for layers {sorted(scales)}; the model's attention layers are {sorted(layers)}")
    dtype = next(model.parameters()).dtype
    out = {}
    for idx, (name, _) in layers.items():
        for suffix, value in zip(MODELOPT_KV_SCALES if fmt == "modelopt" else CT_KV_SCALES, scales[idx]):
            out[file_key(name) + suffix] = (torch.tensor(value, dtype=torch.float32) if fmt == "modelopt"
                                            else torch.tensor([value], dtype=dtype))
    return out
