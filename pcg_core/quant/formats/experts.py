"""MoE experts in quantized checkpoints: one linear per expert and projection on disk, fused tensors in the model.

transformers holds an experts module as [E, 2I, H] gate_up and [E, H, I] down and fuses the per-expert files
when it loads a 16-bit checkpoint itself. Quantized producers (Qwen3-30B-A3B-FP8, llm-compressor, ModelOpt)
write `…experts.<e>.gate_proj.weight` with its own scales, Mixtral under its own names
(`block_sparse_moe.experts.<e>.w1/w3/w2`). Reading them here keeps every scale where it belongs; fusing gate
and up is exact for per-channel and 128-block scales, and for per-tensor scales both shards are re-expressed on
the larger of their two scales (what vLLM does for fused shards), as a static activation scale is the largest
over the experts. The writer is the inverse, for synthetic checkpoints in those layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.layers.expert_layout import expert_count
from pcg_core.quant.layers.experts import install, install_int4, quantizable
from pcg_core.quant.formats.files import EIGHT_BIT, CheckpointTensors, shaped
from pcg_core.quant.formats.detect import QuantSpec
from pcg_core.quant.schemes.fp4 import Fp4Scheme, quantize_nvfp4
from pcg_core.quant.formats.fp4 import Fp4Format, fp4_tensors, read_fp4_weight
from pcg_core.quant.layers.fp4_experts import install_fp4_experts
from pcg_core.quant.schemes.int4 import Int4Scheme, Int4Weight, quantize_int4_ordered
from pcg_core.quant.formats.int4 import Int4Format, int4_tensors, read_int4_weight, stored_weight
from pcg_core.quant.schemes.w8a8 import BLOCK, FP8, Scheme, quantize_weight, weight_scale_shape


@dataclass(frozen=True)
class ExpertLayout:
    """Where an architecture's expert weights live in its files: the model's module path segment and the files'
    (renamed for every key under it, the router's too), and the gate, up and down projections' names."""

    model_segment: str = ""
    file_segment: str = ""
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"

    def file_key(self, key: str) -> str:
        """A model state-dict key (or module name) as the files spell it."""
        return key.replace(self.model_segment, self.file_segment, 1) if self.model_segment else key


LAYOUTS = {"mixtral": ExpertLayout(".mlp.", ".block_sparse_moe.", "w1", "w3", "w2")}


def layout_for(model: torch.nn.Module) -> ExpertLayout:
    return LAYOUTS.get(getattr(model.config, "model_type", ""), ExpertLayout())


def read_experts(module: torch.nn.Module, name: str, tensors: CheckpointTensors, spec: QuantSpec, layout: ExpertLayout) -> bool:
    """Fill the experts module `name` from its per-expert tensors. Returns True if they are quantized (the module
    then holds quantized buffers), False if stored in 16 bits (copied into its parameters as they are)."""
    path, s = tensors.path, spec.scheme
    if not quantizable(module):
        raise UnsupportedModel(f"{path}: {name} ({type(module).__name__}) cannot hold quantized experts: "
                               f"{getattr(module, 'not_quantizable_reason', None) or 'a norm after each expert'}")
    if why := per_expert_layout_refusal(module, f"a {spec.format} ({s.name}) checkpoint"):
        raise UnsupportedModel(f"{path}: {name}: {why}")
    gated, first, e_n, parts, shapes = _experts_shape(module, layout)
    base = layout.file_key(name)
    if spec.int4 is not None:
        return _read_int4_experts(module, name, tensors, spec, base, parts, shapes)
    if spec.fp4 is not None:
        return _read_fp4_experts(module, name, tensors, spec, base, parts, shapes)
    assert isinstance(s, Scheme)  # 8-bit: the 4-bit declarations carry spec.int4 or spec.fp4
    weights = {p: [f"{base}.{e}.{proj}.weight" for e in range(e_n)] for p, proj in parts.items()}
    missing = [k for keys in weights.values() for k in keys if k not in tensors]
    if missing:
        raise UnsupportedModel(f"{path}: the experts of {name} need {missing[0]} (and {len(missing) - 1} more), which the "
                               "checkpoint does not have")
    loaded = {p: [tensors.get(k) for k in keys] for p, keys in weights.items()}
    kinds = {t.dtype in EIGHT_BIT for ts in loaded.values() for t in ts}
    if kinds == {False}:
        _copy_float(module, loaded, gated)
        return False
    if kinds == {False, True}:
        raise UnsupportedModel(f"{path}: {name}'s experts mix 8-bit and 16-bit weights; one experts module is one scheme")
    if spec.ignored(f"{base}.0.{parts['down']}"):
        raise UnsupportedModel(f"{path}: {name}'s experts are stored in 8 bits but {spec.where} lists them as not quantized")
    shards = {p: [_shard(loaded[p][e], tensors, weights[p][e], s, spec, shapes[p]) for e in range(e_n)] for p in parts}
    if gated:
        fused = [_fuse(g, u, s, path, name) for g, u in zip(shards["gate"], shards["up"])]
        ins = [x for g, u in zip(shards["gate"], shards["up"]) for x in (g[2], u[2])]
    else:
        fused = [(q, sc) for q, sc, _ in shards["up"]]
        ins = [x for _, _, x in shards["up"]]
    install(module, s, first, torch.stack([q for q, _ in fused]), torch.stack([sc for _, sc in fused]), _largest(ins))
    down = shards["down"]
    install(module, s, "down_proj", torch.stack([q for q, _, _ in down]), torch.stack([sc for _, sc, _ in down]),
            _largest([x for _, _, x in down]))
    return True


def per_expert_layout_refusal(module: torch.nn.Module, what: str) -> str | None:
    """Why `what` (a checkpoint of one linear per expert and projection) cannot be read into or written from this
    experts module, or None. gpt-oss's transposed, biased experts with gate/up interleaved are quantized in memory
    (experts.py), but their per-expert files are neither read nor written: interleaving a gate and an up file
    breaks 128-row block scales and act-order's per-shard permutations, and the biases would have to be read beside
    them. Their own quantized format, MXFP4 (checkpoint.py), is read."""
    if not (getattr(module, "is_transposed", False) or getattr(module, "has_bias", False)):
        return None
    return (f"{type(module).__name__} holds transposed, biased experts (gpt-oss's layout): {what} of them is not read "
            "or written yet; their quantized checkpoints are read in gpt-oss's own format (quant_method mxfp4), and the "
            "8-bit and int4 schemes run on them with synthetic weights, quantized in memory")


def _experts_shape(module: torch.nn.Module, layout: ExpertLayout) -> tuple[bool, str, int, dict[str, str], dict[str, tuple[int, int]]]:
    """(gated, the first projection's name, experts, part → the files' projection name, part → its (N, K))."""
    gated = hasattr(module, "gate_up_proj")
    first = "gate_up_proj" if gated else "up_proj"
    e_n, n2, h = getattr(module, first).shape
    i = n2 // 2 if gated else n2
    parts = {"gate": layout.gate, "up": layout.up, "down": layout.down} if gated else {"up": layout.up, "down": layout.down}
    return gated, first, e_n, parts, {"gate": (i, h), "up": (i, h), "down": (h, i)}


def _read_int4_experts(module: torch.nn.Module, name: str, tensors: CheckpointTensors, spec: QuantSpec, base: str,
                       parts: dict[str, str], shapes: dict[str, tuple[int, int]]) -> bool:
    """int4 experts (AWQ, GPTQ, compressed-tensors: one packed linear per expert and projection) into the canonical
    buffers of experts.install_int4; gate and up fused along N, each keeping its own act-order permutation. A
    compressed-tensors W4A8 / W4AFP8 declaration (8-bit token activations, none on disk) gives W4A8 experts: the
    declared scheme, installed with them, carries the activation type their forwards quantize to."""
    path, fmt, scheme, e_n = tensors.path, spec.int4, spec.scheme, expert_count(module)
    assert fmt is not None and isinstance(scheme, Int4Scheme)  # read_experts' dispatch: spec.int4 declares int4
    keys = {p: [f"{base}.{e}.{proj}" for e in range(e_n)] for p, proj in parts.items()}
    packed = {fmt.is_packed(tensors, k) for ks in keys.values() for k in ks}
    if packed == {False}:
        if missing := [k for ks in keys.values() for k in ks if f"{k}.weight" not in tensors]:
            raise UnsupportedModel(f"{path}: the experts of {name} need {fmt.packed_key(missing[0])} or {missing[0]}.weight "
                                   f"(and {len(missing) - 1} more), which the checkpoint does not have")
        loaded = {p: [tensors.get(f"{k}.weight") for k in ks] for p, ks in keys.items()}
        if eight := next((f"{keys[p][e]}.weight" for p, ts in loaded.items() for e, t in enumerate(ts)
                          if t.dtype in EIGHT_BIT), None):
            raise UnsupportedModel(f"{path}: {eight} is stored in 8 bits, but {spec.where} declares {spec.scheme.name} "
                                   f"(4-bit) weights")
        _copy_float(module, loaded, "gate" in parts)
        return False
    if packed == {False, True}:
        raise UnsupportedModel(f"{path}: {name}'s experts are partly packed in 4 bits ({fmt.packed_key(keys['down'][0])}) "
                               "and partly not; one experts module is one scheme")
    if spec.ignored(keys["down"][0]):
        raise UnsupportedModel(f"{path}: {name}'s experts are packed in 4 bits but {spec.where} lists them as not quantized")
    read = {p: [read_int4_weight(k, tensors, fmt, scheme, shapes[p]) for k in ks] for p, ks in keys.items()}
    if "gate" in parts:
        fused = [_fuse_int4(g, u) for g, u in zip(read["gate"], read["up"])]
        install_int4(module, scheme, "gate_up_proj", _same_perm_form(fused))
    else:
        install_int4(module, scheme, "up_proj", _same_perm_form(read["up"]))
    install_int4(module, scheme, "down_proj", _same_perm_form(read["down"]))
    return True


def _read_fp4_experts(module: torch.nn.Module, name: str, tensors: CheckpointTensors, spec: QuantSpec, base: str,
                      parts: dict[str, str], shapes: dict[str, tuple[int, int]]) -> bool:
    """NVFP4 experts (ModelOpt, compressed-tensors: one packed linear per expert and projection, each with its own
    global scale) into fp4_experts.install_fp4_experts' buffers; the same presence rule as int4's."""
    path, fmt, scheme, e_n = tensors.path, spec.fp4, spec.scheme, expert_count(module)
    assert fmt is not None and isinstance(scheme, Fp4Scheme)  # read_experts' dispatch: spec.fp4 declares FP4
    keys = {p: [f"{base}.{e}.{proj}" for e in range(e_n)] for p, proj in parts.items()}
    packed = {fmt.is_packed(tensors, k) for ks in keys.values() for k in ks}
    if packed == {False}:
        _copy_float(module, {p: [_float_weight(tensors, k, fmt.packed_key(k), name) for k in ks]
                             for p, ks in keys.items()}, "gate" in parts)
        return False
    if packed == {False, True}:
        raise UnsupportedModel(f"{path}: {name}'s experts are partly packed in FP4 ({fmt.packed_key(keys['down'][0])}) "
                               "and partly not; one experts module is one scheme")
    if spec.ignored(keys["down"][0]):
        raise UnsupportedModel(f"{path}: {name}'s experts are packed in FP4 but {spec.where} lists them as not quantized")
    read = {p: [read_fp4_weight(k, tensors, fmt, shapes[p]) for k in ks] for p, ks in keys.items()}
    install_fp4_experts(module, scheme, read["down"], read["up"], read.get("gate"))
    return True


def _float_weight(tensors: CheckpointTensors, key: str, packed: str, name: str) -> torch.Tensor:
    if f"{key}.weight" not in tensors:
        raise UnsupportedModel(f"{tensors.path}: the experts of {name} need {packed} or {key}.weight, which the "
                               "checkpoint does not have")
    return tensors.get(f"{key}.weight")


def _fuse_int4(gate: Int4Weight, up: Int4Weight) -> Int4Weight:
    """Gate over up along N (exact: scales and zeros are per row). Their act-order permutations differ (each was
    quantized alone), so a fused one holds both: perm [2, K], a shard each; none if neither has one."""
    perm = None
    if gate.perm is not None or up.perm is not None:
        perm = torch.stack([_perm_or_identity(gate), _perm_or_identity(up)])
    return Int4Weight(torch.cat([gate.q, up.q]), torch.cat([gate.scales, up.scales]), torch.cat([gate.zeros, up.zeros]),
                      gate.group, perm)


def _same_perm_form(weights: list[Int4Weight]) -> list[Int4Weight]:
    """Every expert's weight with a perm of one shape if any has one (g_idx = k // G reads as none): the experts'
    perms are stacked."""
    shaped = next((w.perm for w in weights if w.perm is not None), None)
    if shaped is None:
        return weights
    identity = torch.arange(shaped.shape[-1]).expand_as(shaped).contiguous()
    return [w if w.perm is not None else Int4Weight(w.q, w.scales, w.zeros, w.group, identity) for w in weights]


def _perm_or_identity(w: Int4Weight) -> torch.Tensor:
    return w.perm if w.perm is not None else torch.arange(w.q.shape[1])


def _shard(w: torch.Tensor, tensors: CheckpointTensors, key: str, s: Scheme, spec: QuantSpec,
           shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One expert projection's (q, weight scale, static input scale or None), each checked against the scheme."""
    path, mod = tensors.path, key.removesuffix(".weight")
    if w.dtype != s.qdtype or tuple(w.shape) != shape:
        raise UnsupportedModel(f"{path}: {key} is {w.dtype} {tuple(w.shape)}; {spec.format} {s.name} needs {s.qdtype} {shape}")
    skey = f"{mod}.{spec.weight_scale_name}"
    if skey not in tensors:
        raise UnsupportedModel(f"{path}: {key} is quantized but {skey} is missing")
    scale = shaped(tensors.get(skey), weight_scale_shape(s, *shape), skey, path)
    ikey = f"{mod}.input_scale"
    if s.act_dynamic:
        if ikey in tensors:
            raise UnsupportedModel(f"{path}: {ikey} is a static activation scale, but {spec.where} declares dynamic activations")
        return w, scale, None
    if ikey not in tensors:
        raise UnsupportedModel(f"{path}: {s.name} has static activation scales but {ikey} is missing")
    return w, scale, shaped(tensors.get(ikey), (), ikey, path)


def _fuse(gate: tuple, up: tuple, s: Scheme, path: Path, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    (qg, sg, _), (qu, su, _) = gate, up
    if s.weights == "tensor":  # one scale for both: the larger, the other shard re-expressed on it
        top = torch.maximum(sg, su)
        return torch.cat([_requantize(qg, sg / top), _requantize(qu, su / top)]), top
    if s.weights == "block" and qg.shape[0] % BLOCK:
        raise UnsupportedModel(f"{path}: {name}'s expert intermediate size {qg.shape[0]} is not a multiple of {BLOCK}: its "
                               "gate and up block scales cannot be fused")
    return torch.cat([qg, qu]), torch.cat([sg, su])


def _requantize(q: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    if bool(ratio == 1):
        return q
    return (q.float() * ratio).to(FP8)  # |q · ratio| ≤ |q| ≤ 448: no clamp needed


def _largest(scales: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if scales[0] is None else torch.stack(cast(list[torch.Tensor], scales)).max()  # every expert's or none


def _copy_float(module: torch.nn.Module, loaded: dict[str, list[torch.Tensor]], gated: bool) -> None:
    first, down = getattr(module, "gate_up_proj" if gated else "up_proj"), getattr(module, "down_proj")
    with torch.no_grad():
        if gated:
            fused = torch.stack([torch.cat([g, u]) for g, u in zip(loaded["gate"], loaded["up"])])
            first.copy_(fused.to(first.dtype))
        else:
            first.copy_(torch.stack(loaded["up"]).to(first.dtype))
        down.copy_(torch.stack(loaded["down"]).to(down.dtype))


def write_experts(module: torch.nn.Module, name: str, scheme: Scheme | Int4Scheme | Fp4Scheme, scale_name: str, layout: ExpertLayout,
                  input_absmax: dict[str, float] | None, as_stored: Callable[[torch.Tensor], torch.Tensor],
                  int4: Int4Format | None = None, fp4: Fp4Format | None = None) -> dict[str, torch.Tensor]:
    """The float experts module `name` as a producer writes it quantized: per expert and projection, each with its
    own scales (stored as the format stores a linear's: `as_stored`), and the module's calibrated activation
    scale for static schemes; with `int4` or `fp4`, each projection packed as that format packs a linear (its
    own groups and act-order; its own NVFP4 global). gpt-oss's layout is refused (per_expert_layout_refusal),
    never written as if it were [E, N, K]."""
    if why := per_expert_layout_refusal(module, f"a per-expert {scheme.name} checkpoint"):
        raise NotImplementedError(f"{name}: {why}")
    gated = hasattr(module, "gate_up_proj")
    first, down = getattr(module, "gate_up_proj" if gated else "up_proj"), getattr(module, "down_proj")
    i = first.shape[1] // 2 if gated else first.shape[1]
    base = layout.file_key(name)
    out: dict[str, torch.Tensor] = {}
    for e in range(first.shape[0]):
        parts = {layout.down: (down[e], "down")}
        if gated:
            parts |= {layout.gate: (first[e, :i], "gate_up"), layout.up: (first[e, i:], "gate_up")}
        else:
            parts |= {layout.up: (first[e], "gate_up")}
        for proj, (w, calib) in parts.items():
            key = f"{base}.{e}.{proj}"
            if int4 is not None:
                assert isinstance(scheme, Int4Scheme)  # int4 files come with their scheme
                q4 = quantize_int4_ordered(w.detach(), int4.group, scheme.sym, scheme.act_order)
                packed = int4_tensors(stored_weight(q4, int4, w.dtype), int4, scheme.sym, w.dtype)
                out.update({f"{key}.{suffix}": t for suffix, t in packed.items()})
                continue
            if fp4 is not None:
                out.update({f"{key}.{suffix}": t for suffix, t in fp4_tensors(quantize_nvfp4(w.detach()), fp4).items()})
                continue
            assert isinstance(scheme, Scheme)  # 8-bit: the 4-bit schemes wrote their format above
            q, s = quantize_weight(w, scheme)
            out[f"{key}.weight"] = q.contiguous()
            out[f"{key}.{scale_name}"] = as_stored(s)
            if not scheme.act_dynamic:
                assert input_absmax is not None, f"{scheme.name} has static activation scales: pass input_absmax"
                out[f"{key}.input_scale"] = torch.tensor(max(input_absmax[f"{name}.{calib}"], 1e-6) / scheme.qmax)
    return out
