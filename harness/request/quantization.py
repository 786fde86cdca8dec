"""The checkpoint's quantization, read from config.json's quantization_config (null when there is none).

The result is {"method": <quant_method>, ...its parameters}: the fields that say how the weights are stored
(bits, group_size, weight_block_size, activation_scheme, fmt …), copied as published. compressed-tensors
nests them per config group; its first group's weight and activation schemes are lifted to the top
(weight_bits, weight_type, weight_strategy, group_size, activation_bits, activation_dynamic).
"""

from __future__ import annotations

from typing import Any

from pcg_core.errors import ConfigError
from pcg_core.known import KNOWN_QUANTIZATION
from pcg_core.quant.schemes import registry as quant_registry

# Names a --quant flag may use: the matrix's quant-axis words (the registry's schemes and aliases, the umbrella
# words, the checkpoint formats). Whether the runtime can run one is the capability table's call (verdicts.py).
QUANT_WORDS = KNOWN_QUANTIZATION
# Fields that describe storage, per method; anything else a method has is kept too, in the order published.
_KEY_ORDER = ("bits", "group_size", "fmt", "weight_block_size", "activation_scheme", "quant_algo", "kv_cache_quant_algo",
              "sym", "desc_act", "zero_point", "version", "format")


def check_quant_words(words: list[str]) -> list[str]:
    out = []
    for w in words:
        word = w.strip().lower()
        if word not in QUANT_WORDS:
            raise ConfigError(f"--quant {w!r} is not a quantization scheme; use one of {', '.join(QUANT_WORDS)}")
        out.append(quant_registry.canonical(word))  # fp4 asks for NVFP4, as the runtime names it
    return out


def _compressed_tensors(qc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups = qc.get("config_groups")
    if isinstance(groups, dict) and groups:
        first = next(iter(groups.values()))
        if isinstance(first, dict):
            w = first.get("weights") or {}
            a = first.get("input_activations") or {}
            if isinstance(w, dict):
                for src, dst in (("num_bits", "weight_bits"), ("type", "weight_type"), ("strategy", "weight_strategy"),
                                 ("group_size", "group_size"), ("block_structure", "weight_block_size")):
                    if w.get(src) is not None:
                        out[dst] = w[src]
            if isinstance(a, dict) and a:
                for src, dst in (("num_bits", "activation_bits"), ("type", "activation_type"), ("dynamic", "activation_dynamic")):
                    if a.get(src) is not None:
                        out[dst] = a[src]
        out["groups"] = len(groups)
    return out


def quantization_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """{"method": ..., params} or None for an unquantized checkpoint."""
    qc = config.get("quantization_config") or config.get("compression_config")
    if qc is None:
        for key in ("text_config", "llm_config", "language_config"):
            nested = config.get(key)
            if isinstance(nested, dict) and nested.get("quantization_config"):
                qc = nested["quantization_config"]
                break
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise ConfigError(f"field quantization_config must be a mapping, got {qc!r}; fix the config.json")
    method = qc.get("quant_method")
    if method is None and ("load_in_4bit" in qc or "load_in_8bit" in qc):
        method = "bitsandbytes"
    method = str(method or "unknown").lower().replace("_", "-")
    out: dict[str, Any] = {"method": method}
    if method == "compressed-tensors":
        out.update(_compressed_tensors(qc))
    for key in _KEY_ORDER:
        if key in qc and key not in out:
            out[key] = qc[key]
    for key, value in qc.items():
        if key not in out and key not in ("quant_method", "config_groups"):
            out[key] = value
    return out


def quant_word(quant: dict[str, Any] | None) -> str:
    """The quant-axis word for a checkpoint's quantization: its method, or "none"."""
    return "none" if quant is None else quant["method"]


def describe(quant: dict[str, Any] | None) -> str:
    if quant is None:
        return "none (unquantized)"
    bits = []
    for key in ("fmt", "bits", "weight_bits", "weight_type", "quant_algo"):
        if quant.get(key) is not None:
            bits.append(f"{key} {quant[key]}")
    if quant.get("weight_block_size"):
        bits.append("block " + "x".join(str(b) for b in quant["weight_block_size"]))
    if quant.get("group_size") is not None:
        bits.append(f"group {quant['group_size']}")
    if quant.get("activation_scheme"):
        bits.append(f"{quant['activation_scheme']} activations")
    return quant["method"] + (f" ({', '.join(bits)})" if bits else "")
