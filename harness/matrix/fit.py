"""Memory fit: will a cell's model fit the GPUs its parallel mode gives it? An estimate per GPU, from the model
card's config alone (harness/shape/params.py's parameter count), so a cell that cannot fit is refused before
launch with the GPUs it needs, instead of running out of memory minutes into its load.

Per GPU, for a cell at (tp, pp, dp, ep) — see pcg_core.known.world_size:

    weights   linears (attention, linear attention, dense and shared MLPs) / (tp·pp); routed experts
              / (pp·max(tp, ep)); embedding and lm_head / tp (vocabulary-parallel; one PP stage holds each);
              norms, routers and a vision tower replicated. Linears of a quantized scheme at its weight width (fp8,
              int8: 1 byte; int4, fp4: ½), the rest in the cell's dtype.
    KV        two engines (eager and graph) × max_tokens slots × bytes per token: full and sliding layers
              2·kv_heads·head_dim (over min(tp, kv_heads) ranks), MLA the latent row kv_lora_rank + rope dim
              (every rank holds it), linear-attention layers none; / pp; FP8 KV cache 1 byte, else the dtype.
    graphs    the largest bucket's activations (max_tokens × (4·hidden + 3·the widest MLP / tp) in the dtype, plus
              float32 logits of max_tokens × vocab / tp), twice (graph pools beside eager), plus params.HEADROOM
              of the weights.

It is an estimate: it errs large (two engines, float32 logits), and it leaves out quantization scales.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from harness.shape.fields import TEXT_CONFIG_KEYS
from harness.shape.params import HEADROOM, count
from harness.shape.structure import Structure, read_structure
from pcg_core.known import MAX_PARALLEL_DEGREE, parse_parallel, world_size

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
_WEIGHT_BYTES = {"fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}  # a scheme's weight width (registry `weights`)
_LINEARS = ("attention", "linear_attention", "mlp", "shared_experts")
_GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU."""

    weights: int
    kv: int
    graphs: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.graphs

    def words(self) -> str:
        return (f"~{self.total / _GIB:.1f} GiB per GPU (weights {self.weights / _GIB:.1f} + KV {self.kv / _GIB:.1f} + "
                f"graphs {self.graphs / _GIB:.1f})")


def trimmed(config: dict[str, Any], layers: int | None) -> dict[str, Any]:
    """The config with its first `layers` decoder layers only (trim:N), in the text config where it has one."""
    if layers is None:
        return config
    out = copy.deepcopy(config)
    target = next((out[k] for k in TEXT_CONFIG_KEYS if isinstance(out.get(k), dict)), out)
    target["num_hidden_layers"] = min(layers, int(target.get("num_hidden_layers") or layers))
    return out


def kv_bytes_per_token(s: Structure, tp: int, per: float) -> float:
    """KV-cache bytes one token takes on one of tp ranks, `per` bytes an element (MLA: its latent row, whole)."""
    total = 0.0
    kv_heads, head_dim = s.kv_heads or s.heads or 1, s.head_dim or 0
    for kind in s.attention:
        if kind == "mla":
            total += (s.f.get_int("kv_lora_rank", 0) + s.f.get_int("qk_rope_head_dim", 0)) * per
        elif kind != "linear":
            total += 2 * kv_heads * head_dim * per / min(tp, kv_heads)
    return total


def estimate(config: dict[str, Any], mode: str, dtype: str, quant_weights: str | None, max_tokens: int,
             kv_cache: str = "auto", where: str = "config") -> MemoryEstimate | None:
    """Bytes per GPU of a cell of this (already trimmed) config at parallel mode `mode`; None when the config lacks
    the widths a count needs. quant_weights: the scheme's weight width (fp8, int8, int4, fp4) or None."""
    s = read_structure(config, where)
    n = count(config, s, where)
    if n is None:
        return None
    d = parse_parallel(mode)
    tp, pp, ep = d.get("tp", 1), d.get("pp", 1), d.get("ep", 1)
    per = DTYPE_BYTES.get(dtype, 2.0)
    linear = _WEIGHT_BYTES.get(quant_weights or "", per)
    b = n.breakdown
    weights = (sum(b.get(k, 0) for k in _LINEARS) * linear / (tp * pp)
               + b.get("experts", 0) * linear / (pp * max(tp, ep))
               + (b.get("embedding", 0) + b.get("lm_head", 0)) * per / tp
               + (b.get("norms", 0) + b.get("router", 0) + b.get("vision", 0)) * per)
    kv = 2 * max_tokens * kv_bytes_per_token(s, tp, 1.0 if kv_cache == "fp8_e4m3" else per) / pp
    widest = max([s.intermediate or 0] + ([s.moe.expert_intermediate * s.moe.top_k] if s.moe else []))
    act = max_tokens * (4 * (s.hidden or 0) + 3 * widest / tp) * per + max_tokens * (s.vocab or 0) * 4 / tp
    return MemoryEstimate(int(weights), int(kv), int(2 * act + HEADROOM * weights))


def scaled(mode: str, factor: int) -> str:
    """`mode` with its TP degree multiplied by `factor` (tp1 → tp4, pp2 → tp2-pp2, tp2-ep8 → tp4-ep8)."""
    d = parse_parallel(mode)
    d["tp"] = d.get("tp", 1) * factor
    return "-".join(f"{k}{d[k]}" for k in ("tp", "pp", "dp", "ep") if k in d)


def fit_reason(config: dict[str, Any], mode: str, dtype: str, quant_weights: str | None, max_tokens: int,
               kv_cache: str, gpu_bytes: int, where: str = "config") -> str | None:
    """Why a cell at `mode` cannot fit GPUs of `gpu_bytes` each — `needs N GPUs`, N the ranks of the smallest TP
    multiple of its mode that fits — or None (it fits, or the config has no count)."""
    here = estimate(config, mode, dtype, quant_weights, max_tokens, kv_cache, where)
    if here is None or here.total <= gpu_bytes:
        return None
    factor = 2
    while factor * parse_parallel(mode).get("tp", 1) <= MAX_PARALLEL_DEGREE:
        bigger = scaled(mode, factor)
        try:
            fits = (e := estimate(config, bigger, dtype, quant_weights, max_tokens, kv_cache, where)) is not None \
                and e.total <= gpu_bytes
            ranks = world_size(bigger)
        except ValueError:  # degrees that no longer nest: try the next
            fits = False
        if fits:
            return (f"needs {ranks} GPUs: at {mode} {here.words()}, over the GPU's {gpu_bytes / _GIB:.1f} GiB; "
                    f"{bigger} would fit")
        factor *= 2
    return f"needs more than {MAX_PARALLEL_DEGREE} GPUs: at {mode} {here.words()}, over the GPU's {gpu_bytes / _GIB:.1f} GiB"
