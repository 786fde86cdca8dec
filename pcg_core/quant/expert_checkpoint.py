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

import torch

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.experts import install, quantizable
from pcg_core.quant.files import EIGHT_BIT, CheckpointTensors, shaped
from pcg_core.quant.formats import QuantSpec
from pcg_core.quant.schemes import BLOCK, FP8, Scheme, quantize_weight, weight_scale_shape


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
    if not quantizable(module):  # the [E, N, K] layout the per-expert files are fused into
        raise UnsupportedModel(f"{path}: {name} ({type(module).__name__}) holds transposed or biased experts; its quantized "
                               "checkpoint layout is not read yet")
    gated = hasattr(module, "gate_up_proj")
    first = "gate_up_proj" if gated else "up_proj"
    e_n, n2, h = getattr(module, first).shape
    i = n2 // 2 if gated else n2
    base = layout.file_key(name)
    parts = {"gate": layout.gate, "up": layout.up, "down": layout.down} if gated else {"up": layout.up, "down": layout.down}
    shapes = {"gate": (i, h), "up": (i, h), "down": (h, i)}
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
    return None if scales[0] is None else torch.stack(scales).max()


def _copy_float(module: torch.nn.Module, loaded: dict[str, list[torch.Tensor]], gated: bool) -> None:
    with torch.no_grad():
        if gated:
            fused = torch.stack([torch.cat([g, u]) for g, u in zip(loaded["gate"], loaded["up"])])
            module.gate_up_proj.copy_(fused.to(module.gate_up_proj.dtype))
        else:
            module.up_proj.copy_(torch.stack(loaded["up"]).to(module.up_proj.dtype))
        module.down_proj.copy_(torch.stack(loaded["down"]).to(module.down_proj.dtype))


def write_experts(module: torch.nn.Module, name: str, scheme: Scheme, scale_name: str, layout: ExpertLayout,
                  input_absmax: dict[str, float] | None, as_stored: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float experts module `name` as a producer writes it quantized: per expert and projection, each with its
    own scales (stored as the format stores a linear's: `as_stored`), and the module's calibrated activation
    scale for static schemes."""
    gated = hasattr(module, "gate_up_proj")
    first = module.gate_up_proj if gated else module.up_proj
    i = first.shape[1] // 2 if gated else first.shape[1]
    base = layout.file_key(name)
    out: dict[str, torch.Tensor] = {}
    for e in range(first.shape[0]):
        parts = {layout.down: (module.down_proj[e], "down")}
        if gated:
            parts |= {layout.gate: (first[e, :i], "gate_up"), layout.up: (first[e, i:], "gate_up")}
        else:
            parts |= {layout.up: (first[e], "gate_up")}
        for proj, (w, calib) in parts.items():
            q, s = quantize_weight(w, scheme)
            key = f"{base}.{e}.{proj}"
            out[f"{key}.weight"] = q.contiguous()
            out[f"{key}.{scale_name}"] = as_stored(s)
            if not scheme.act_dynamic:
                out[f"{key}.input_scale"] = torch.tensor(max(input_absmax[f"{name}.{calib}"], 1e-6) / scheme.qmax)
    return out
