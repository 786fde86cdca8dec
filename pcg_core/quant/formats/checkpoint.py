"""Quantized checkpoints: loading one into transformers' model, and writing synthetic ones in the real formats.

Loading is ours, not transformers': it would read FP8 bytes into bf16 parameters for the formats it does not
know. The rule that keeps weights honest: a linear is quantized exactly when its stored weight is 8-bit, and
then its scales must be there in the declared scheme's shapes; every tensor the model needs must be found, and
every tensor the checkpoint holds must be used (or belong to layers trimmed away). Anything else is an error
that names the tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.formats.experts import ExpertLayout, layout_for, read_experts, write_experts
from pcg_core.quant.layers.experts import is_experts
from pcg_core.quant.formats.files import EIGHT_BIT, CheckpointTensors, shaped
from pcg_core.quant.formats.detect import HF_QUANT_CONFIG, QuantSpec, declaration, ignored
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.schemes.fp4 import Fp4Scheme, quantize_nvfp4
from pcg_core.quant.layers.fp4_experts import gpt_oss_mxfp4_tensors, read_gpt_oss_mxfp4
from pcg_core.quant.formats.fp4 import Fp4Format, declaration as fp4_declaration, fp4_tensors, read_fp4_linear
from pcg_core.quant.layers.int4_linear import Int4Linear
from pcg_core.quant.schemes.int4 import Int4Scheme, quantize_int4_ordered
from pcg_core.quant.formats.int4 import (CT_INT, Int4Format, common_group, declaration as int4_declaration,
                                        int4_tensors, read_int4_linear, stored_weight)
from pcg_core.quant.layers.linear import QuantLinear
from pcg_core.quant.schemes.w8a8 import Scheme, quantize_weight
from pcg_core.quant.formats.kv_scales import declare_kv_cache, kv_scale_tensors, read_kv_scales

# A decoder layer's tensors, a text model's (model.layers.N) or a VLM's (model.language_model.layers.N): those past
# the layers kept are skipped, not refused.
_LAYER = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.")


@dataclass
class LoadReport:
    quantized: list[str] = field(default_factory=list)  # linears swapped for QuantLinear
    unquantized: list[str] = field(default_factory=list)  # linears the checkpoint keeps in 16 bits
    skipped_layers: int = 0  # tensors of layers past the ones kept
    # A checkpoint declaring an FP8 KV cache: {decoder layer: (k_scale, v_scale)}, read and checked (kv_scales.py);
    # also set on the model as `pcg_kv_scales`. Empty: none declared.
    kv_scales: dict[int, tuple[float, float]] = field(default_factory=dict)


def load_quantized(model: torch.nn.Module, path: str | Path, spec: QuantSpec, layers: int | None = None) -> LoadReport:
    """Fill `model` (transformers' class, built for the config) from the quantized checkpoint at `path`. A declared
    FP8 KV cache's scales are read and checked, and set on the model as `pcg_kv_scales` ({decoder layer index:
    (k_scale, v_scale)}, dequantization multipliers: k ≈ k_fp8 · k_scale) for the runtime that applies them."""
    path = Path(path)
    tensors = CheckpointTensors(path, getattr(model.config, "transformers_weights", None))
    report, layout = LoadReport(), layout_for(model)
    for name, mod in list(model.named_modules()):
        if is_experts(mod) and spec.format == "mxfp4":
            if _mxfp4_experts(mod, layout.file_key(name), tensors):
                report.quantized.append(name)
            continue  # experts stored in 16 bits: _load_rest copies their parameters
        if is_experts(mod):
            (report.quantized if read_experts(mod, name, tensors, spec, layout) else report.unquantized).append(name)
            continue
        if spec.int4 is not None and type(mod) is torch.nn.Linear and spec.int4.is_packed(tensors, layout.file_key(name)):
            _swap(model, name, _int4_linear(mod, layout.file_key(name), tensors, spec))
            report.quantized.append(name)
            continue
        if spec.fp4 is not None and type(mod) is torch.nn.Linear and spec.fp4.is_packed(tensors, layout.file_key(name)):
            _swap(model, name, _fp4_linear(mod, layout.file_key(name), tensors, spec))
            report.quantized.append(name)
            continue
        key = layout.file_key(f"{name}.weight")
        if type(mod) is not torch.nn.Linear or key not in tensors:
            continue
        w = tensors.get(key)
        if w.dtype not in EIGHT_BIT:
            report.unquantized.append(name)
            continue
        if spec.int4 is not None or spec.fp4 is not None or spec.format == "mxfp4":  # what the declaration does not say
            raise UnsupportedModel(f"{path}: {key} is stored in {w.dtype}, but {spec.where} declares {spec.format} "
                                   f"{spec.scheme.name} (4-bit) weights")
        if spec.ignored(layout.file_key(name)):
            raise UnsupportedModel(f"{path}: {key} is stored in {w.dtype} but {spec.where} lists {name} as not quantized")
        _swap(model, name, _quant_linear(mod, w, tensors, layout.file_key(name), spec))
        report.quantized.append(name)
    _load_rest(model, tensors, layout, report)
    if spec.kv_cache is not None:
        report.kv_scales = read_kv_scales(model, tensors, spec.kv_cache, layout.file_key)
        setattr(model, "pcg_kv_scales", dict(report.kv_scales))
    _check_all_used(tensors, layers, report, spec, unexpected_ok(model))
    if not report.quantized:
        four = spec.int4 or spec.fp4
        stored = (f"stored in 4 bits ({four.packed_key('<linear>')})" if four else "stored in 8 bits"
                  if spec.format != "mxfp4" else "an MoE expert module in MXFP4 (<experts>.gate_up_proj_blocks)")
        raise UnsupportedModel(f"{path}: {spec.where} declares {spec.format} ({spec.scheme.name}) but no linear layer's weight "
                               f"is {stored}; the declaration or the files are wrong")
    return report


def _mxfp4_experts(mod: torch.nn.Module, name: str, tensors: CheckpointTensors) -> bool:
    """gpt-oss's experts `name` (as the files spell it) from their MXFP4 blocks, scales and biases: True; False
    when the files hold them in 16 bits (`gate_up_proj`)."""
    prefix = f"{name}."
    if f"{prefix}gate_up_proj_blocks" not in tensors:
        if f"{prefix}gate_up_proj" not in tensors:
            raise UnsupportedModel(f"{tensors.path}: the experts of {name} need {prefix}gate_up_proj_blocks (MXFP4) or "
                                   f"{prefix}gate_up_proj (16-bit), which the checkpoint does not have")
        return False
    read_gpt_oss_mxfp4(mod, tensors, prefix)
    return True


def _swap(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def _int4_linear(mod: torch.nn.Linear, name: str, tensors: CheckpointTensors, spec: QuantSpec) -> Int4Linear:
    """The int4 linear `name` (as the files spell it); a linear the declaration leaves alone must not be packed."""
    assert spec.int4 is not None and isinstance(spec.scheme, Int4Scheme)  # load_quantized's dispatch: spec.int4 declares int4
    if spec.ignored(name):
        raise UnsupportedModel(f"{tensors.path}: {spec.int4.packed_key(name)} is packed in 4 bits but {spec.where} lists "
                               f"{name} as not quantized")
    return read_int4_linear(mod, name, tensors, spec.int4, spec.scheme)


def _fp4_linear(mod: torch.nn.Linear, name: str, tensors: CheckpointTensors, spec: QuantSpec) -> Fp4Linear:
    """The FP4 linear `name` (as the files spell it); a linear the declaration leaves alone must not be packed."""
    assert spec.fp4 is not None and isinstance(spec.scheme, Fp4Scheme)  # load_quantized's dispatch: spec.fp4 declares FP4
    if spec.ignored(name):
        raise UnsupportedModel(f"{tensors.path}: {spec.fp4.packed_key(name)} is packed in FP4 but {spec.where} lists "
                               f"{name} as not quantized")
    return read_fp4_linear(mod, name, tensors, spec.fp4, spec.scheme)


def _quant_linear(mod: torch.nn.Linear, w: torch.Tensor, tensors: CheckpointTensors, name: str, spec: QuantSpec) -> QuantLinear:
    """The linear `name` (as the files spell it) quantized from its stored tensors."""
    s = spec.scheme
    assert isinstance(s, Scheme)  # an 8-bit weight: load_quantized refused it under a 4-bit declaration
    path = tensors.path
    dev = mod.weight.device
    q = QuantLinear(mod.in_features, mod.out_features, s, mod.bias is not None, dev, mod.weight.dtype)
    if w.dtype != s.qdtype or tuple(w.shape) != tuple(q.weight.shape):
        raise UnsupportedModel(f"{path}: {name}.weight is {w.dtype} {tuple(w.shape)}; {spec.format} {s.name} needs "
                               f"{s.qdtype} {tuple(q.weight.shape)}")
    q.weight.copy_(w)
    key = f"{name}.{spec.weight_scale_name}"
    if key not in tensors:
        raise UnsupportedModel(f"{path}: {name}.weight is quantized but {key} is missing")
    q.weight_scale.copy_(shaped(tensors.get(key), q.weight_scale.shape, key, path))
    key = f"{name}.input_scale"
    if q.input_scale is not None:
        if key not in tensors:
            raise UnsupportedModel(f"{path}: {s.name} has static activation scales but {key} is missing")
        q.input_scale.copy_(shaped(tensors.get(key), (), key, path))
    elif key in tensors:
        raise UnsupportedModel(f"{path}: {key} is a static activation scale, but {spec.where} declares dynamic activations")
    if mod.bias is not None:
        assert q.bias is not None  # built with a bias
        q.bias.copy_(tensors.get(f"{name}.bias"))
    return q


def _load_rest(model: torch.nn.Module, tensors: CheckpointTensors, layout: ExpertLayout, report: LoadReport) -> None:
    """Every other tensor of the model's state dict, from the file of the same name (tied weights follow)."""
    done = set(report.quantized) | {n for n in report.unquantized if is_experts(model.get_submodule(n))}
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if getattr(model.config, "tie_word_embeddings", False) else set()
    path = tensors.path
    for key, param in model.state_dict().items():
        if key.rpartition(".")[0] in done:
            continue
        file_key = layout.file_key(key)
        if file_key not in tensors:
            if key in tied:
                continue
            raise UnsupportedModel(f"{path}: the model needs {file_key}, which the checkpoint does not have")
        t = tensors.get(file_key)
        if tuple(t.shape) != tuple(param.shape):
            raise UnsupportedModel(f"{path}: {file_key} is {tuple(t.shape)} on disk, the model's is {tuple(param.shape)}")
        if t.dtype in EIGHT_BIT:
            raise UnsupportedModel(f"{path}: {file_key} is stored in {t.dtype} but is not a linear layer's weight this loader "
                                   "quantizes")
        with torch.no_grad():
            param.copy_(t.to(param.dtype))


def unexpected_ok(model: torch.nn.Module) -> tuple[re.Pattern, ...]:
    """The tensors transformers itself leaves unread in this model's checkpoints without a word (its class's
    `_keys_to_ignore_on_load_unexpected`, searched as transformers searches them): Qwen3-Next's multi-token-
    prediction head `mtp.*`, which its checkpoints carry (8-bit in an FP8 one) and its model has no module for."""
    return tuple(re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())


def _check_all_used(tensors: CheckpointTensors, layers: int | None, report: LoadReport, spec: QuantSpec,
                    unexpected: tuple[re.Pattern, ...] = ()) -> None:
    left = []
    for k in tensors.keys():
        if k in tensors.used or any(p.search(k) for p in unexpected):
            continue
        m = _LAYER.match(k)
        if layers is not None and m and int(m.group(1)) >= layers:
            report.skipped_layers += 1
            continue
        left.append(k)
    if kv := sorted(k for k in left if k.endswith(("k_scale", "v_scale"))):
        why = ("the model has no attention layer of that name" if spec.kv_cache is not None else
               f"{spec.where} declares no quantized KV cache (ModelOpt: kv_cache_quant_algo FP8; compressed-tensors: "
               "kv_cache_scheme), so they would go unread; the declaration or the files are wrong")
        raise UnsupportedModel(f"{tensors.path}: holds KV-cache scales ({', '.join(kv[:2])}{', …' if len(kv) > 2 else ''}) "
                               f"but {why}")
    if left:
        raise UnsupportedModel(f"{tensors.path}: {len(left)} tensors the model does not use, e.g. {', '.join(sorted(left)[:4])}: "
                               "a different architecture or an unsupported quantization layout")


# Writing ----------------------------------------------------------------------------------------------------
def write_checkpoint(model: torch.nn.Module, config_data: dict[str, Any], out_dir: str | Path, fmt: str,
                     scheme: Scheme | Int4Scheme | Fp4Scheme,
                     *, legacy: bool = False, ignore: tuple[str, ...] = ("lm_head",), shards: int = 1,
                     input_absmax: dict[str, float] | None = None, ct_format: str = "pack-quantized",
                     kv_scales: dict[int, tuple[float, float]] | None = None) -> Path:
    """`model`'s float weights quantized with `scheme` and written as `fmt`'s producer writes them: tensor names,
    dtypes and shapes, config.json's quantization_config (or ModelOpt's legacy hf_quant_config.json). A static
    scheme needs each linear's calibrated input absmax (calibrate.record_input_absmax). `ct_format`: the
    compressed-tensors format of int4 weights, pack-quantized (8 per int32) or int-quantized (one per int8, as
    llm-compressor writes W4A8 / W4AFP8). `kv_scales` ({decoder layer: (k_scale, v_scale)}, e.g.
    calibrate.producer_kv_scales) declares an FP8 KV cache and writes them as the producer does (modelopt,
    compressed-tensors). Test utility and synthetic-checkpoint maker; nothing here is read back by the loader
    except through the files."""
    if ct_format not in ("pack-quantized", "int-quantized"):
        raise ValueError(f"ct_format {ct_format!r}: int4 weights are written pack-quantized or int-quantized")
    if ct_format != "pack-quantized" and (fmt != "compressed-tensors" or not isinstance(scheme, Int4Scheme)):
        raise ValueError(f"ct_format is compressed-tensors' layout of int4 weights, not of {fmt} {scheme.name}")
    if not scheme.act_dynamic and input_absmax is None:
        raise ValueError(f"{scheme.name} has static activation scales: pass input_absmax from a calibration run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layout = layout_for(model)
    job = _Job(model, fmt, scheme, layout, ignore, legacy, ct_format, input_absmax,
               linears={n: m for n, m in model.named_modules()
                        if type(m) is torch.nn.Linear and not ignored(layout.file_key(n), ignore)},
               experts={n: m for n, m in model.named_modules() if is_experts(m)})
    family = _family(fmt, scheme)
    plan = family.declare(job)
    qc, legacy_cfg = plan.qc, plan.legacy_cfg
    if kv_scales is not None:
        qc, legacy_cfg = declare_kv_cache(fmt, qc, legacy_cfg)
    tensors = _tensors(job, plan, family)
    if kv_scales is not None:
        tensors.update(kv_scale_tensors(model, fmt, kv_scales, layout.file_key))
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    _save_shards(tensors, out, shards)
    _write_config(out, config_data, model, qc, legacy_cfg)
    return out


@dataclass(frozen=True)
class _Job:
    """One write_checkpoint call as its writers read it: the arguments, and the modules it quantizes (the linears
    not ignored, every experts module)."""

    model: torch.nn.Module
    fmt: str
    scheme: Scheme | Int4Scheme | Fp4Scheme
    layout: ExpertLayout
    ignore: tuple[str, ...]
    legacy: bool
    ct_format: str
    input_absmax: dict[str, float] | None
    linears: dict[str, torch.nn.Module]
    experts: dict[str, torch.nn.Module]

    @property
    def scale_name(self) -> str:
        """HF's fp8 (DeepSeek's) names a weight's scale as the inverse it is."""
        return "weight_scale_inv" if self.fmt == "fp8" else "weight_scale"

    def as_stored(self, s: torch.Tensor) -> torch.Tensor:
        """An 8-bit weight scale in the shape its producer writes."""
        if self.fmt == "modelopt" and isinstance(self.scheme, Scheme) and self.scheme.weights == "channel":
            return s.reshape(-1)  # ModelOpt writes per-channel scales flat
        return s.reshape(s.shape or (1,)) if self.fmt == "compressed-tensors" else s.contiguous()


@dataclass(frozen=True)
class _Plan:
    """What a family declares: config.json's quantization_config, ModelOpt's legacy file, and the packed layout
    of 4-bit weights."""

    qc: dict[str, Any] | None
    legacy_cfg: dict[str, Any] | None
    int4: Int4Format | None = None
    fp4: Fp4Format | None = None


def _declare_mxfp4(job: _Job) -> _Plan:
    """gpt-oss's own format: the experts' blocks/scales tensors, every linear in 16 bits."""
    if not isinstance(job.scheme, Fp4Scheme) or job.scheme.name != "mxfp4" or not job.experts:
        raise ValueError("the mxfp4 format holds MoE experts (gpt-oss) in the mxfp4 scheme")
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", *job.ignore]}
    return _Plan(qc, None)


def _declare_int4(job: _Job) -> _Plan:
    """One group size for every packed weight, the largest that divides all their widths (common_group)."""
    assert isinstance(job.scheme, Int4Scheme)  # the int4 family (_family)
    widths = [m.in_features for m in job.linears.values()] + [w.shape[-1] for m in job.experts.values()
                                                              for w in (getattr(m, "down_proj"), getattr(m, "gate_up_proj", getattr(m, "down_proj")))]
    int4 = Int4Format(CT_INT if job.fmt == "compressed-tensors" and job.ct_format == "int-quantized" else job.fmt,
                      common_group(job.scheme, widths))
    return _Plan(int4_declaration(int4.name, job.scheme, int4.group, job.ignore), None, int4=int4)


def _declare_fp4(job: _Job) -> _Plan:
    """ModelOpt's NVFP4 declares W4A4 (input_scale); compressed-tensors' NVFP4A16."""
    fp4 = Fp4Format(job.fmt, act_scale=job.fmt == "modelopt")
    return _Plan(*fp4_declaration(fp4, job.ignore, job.legacy), fp4=fp4)


def _declare_8bit(job: _Job) -> _Plan:
    """FP8 and INT8 weights: each format's producer declares them its own way (detect.declaration)."""
    assert isinstance(job.scheme, Scheme)  # the 8-bit family (_family)
    return _Plan(*declaration(job.fmt, job.scheme, job.ignore, job.legacy))


def _int4_weight(job: _Job, plan: _Plan, mod: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """A linear's weight packed in 4 bits as `plan.int4`'s producer packs it (its groups, act-order, zeros)."""
    assert plan.int4 is not None and isinstance(job.scheme, Int4Scheme)  # the int4 family (_declare_int4)
    w = stored_weight(quantize_int4_ordered(t.detach(), plan.int4.group, job.scheme.sym, job.scheme.act_order),
                      plan.int4, t.dtype)
    base = job.layout.file_key(mod)
    return {f"{base}.{k}": v for k, v in int4_tensors(w, plan.int4, job.scheme.sym, t.dtype).items()}


def _fp4_weight(job: _Job, plan: _Plan, mod: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """A linear's weight in NVFP4: codes, block scales and the global scale, as `plan.fp4` names them."""
    assert plan.fp4 is not None  # the fp4 family (_declare_fp4)
    return {f"{job.layout.file_key(mod)}.{k}": v for k, v in fp4_tensors(quantize_nvfp4(t), plan.fp4).items()}


def _8bit_weight(job: _Job, plan: _Plan, mod: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """A linear's 8-bit weight, its scale, and for a static scheme its calibrated activation scale."""
    scheme = job.scheme
    assert isinstance(scheme, Scheme)  # the 8-bit family (_family)
    q, s = quantize_weight(t, scheme)
    base = job.layout.file_key(mod)
    out = {job.layout.file_key(f"{mod}.weight"): q.contiguous(), f"{base}.{job.scale_name}": job.as_stored(s)}
    if not scheme.act_dynamic:
        assert job.input_absmax is not None  # write_checkpoint refuses a static scheme without it
        out[f"{base}.input_scale"] = torch.tensor(max(job.input_absmax[mod], 1e-6) / scheme.qmax)
    return out


def _mxfp4_experts_tensors(job: _Job, plan: _Plan, name: str, mod: torch.nn.Module) -> dict[str, torch.Tensor]:
    """gpt-oss's experts as its own files hold them: MXFP4 blocks and scales, biases in 16 bits."""
    return gpt_oss_mxfp4_tensors(mod, f"{job.layout.file_key(name)}.")


def _experts_tensors(job: _Job, plan: _Plan, name: str, mod: torch.nn.Module) -> dict[str, torch.Tensor]:
    """An experts module per expert and projection, each packed as the format packs a linear (write_experts)."""
    return write_experts(mod, name, job.scheme, job.scale_name, job.layout, job.input_absmax, job.as_stored,
                         plan.int4, plan.fp4)


@dataclass(frozen=True)
class _Family:
    """How one family of checkpoints is written: its declaration, a quantized linear's tensors (None: every linear
    stays in 16 bits), an experts module's tensors."""

    declare: Callable[[_Job], _Plan]
    linear: Callable[[_Job, _Plan, str, torch.Tensor], dict[str, torch.Tensor]] | None
    experts: Callable[[_Job, _Plan, str, torch.nn.Module], dict[str, torch.Tensor]]


_FAMILIES: dict[str, _Family] = {
    "mxfp4": _Family(_declare_mxfp4, None, _mxfp4_experts_tensors),
    "int4": _Family(_declare_int4, _int4_weight, _experts_tensors),
    "fp4": _Family(_declare_fp4, _fp4_weight, _experts_tensors),
    "8-bit": _Family(_declare_8bit, _8bit_weight, _experts_tensors),
}
# The scheme's kind names the family of every format but mxfp4; the first match wins, 8-bit when none does.
_SCHEME_FAMILIES: tuple[tuple[type, str], ...] = ((Int4Scheme, "int4"), (Fp4Scheme, "fp4"))


def _family(fmt: str, scheme: Scheme | Int4Scheme | Fp4Scheme) -> _Family:
    """gpt-oss's mxfp4 is a format of its own, whatever the scheme (its declaration checks it); the others are
    written by their scheme's kind."""
    if fmt == "mxfp4":
        return _FAMILIES["mxfp4"]
    return _FAMILIES[next((family for kind, family in _SCHEME_FAMILIES if isinstance(scheme, kind)), "8-bit")]


def _tensors(job: _Job, plan: _Plan, family: _Family) -> dict[str, torch.Tensor]:
    """Every tensor of the files, named as the producer names them: the experts' and the quantized linears'
    weights by the family's writers, every other tensor of the state dict as it is."""
    tensors: dict[str, torch.Tensor] = {}
    for name, mod in job.experts.items():
        tensors.update(family.experts(job, plan, name, mod))
    linear = family.linear
    linears = job.linears if linear is not None else {}
    for key, t in job.model.state_dict().items():
        owner = key.rpartition(".")[0]
        if owner in job.experts:
            continue
        if linear is not None and owner in linears and key.endswith(".weight"):
            tensors.update(linear(job, plan, owner, t))
        else:
            tensors[job.layout.file_key(key)] = t.detach().clone().contiguous()
    return tensors


def _save_shards(tensors: dict[str, torch.Tensor], out: Path, shards: int) -> None:
    """The tensors in `shards` files of consecutive names, with transformers' index when there are several."""
    keys = sorted(tensors)
    per = -(-len(keys) // shards)
    index = {}
    for i in range(shards):
        part = keys[i * per:(i + 1) * per]
        name = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, out / name, metadata={"format": "pt"})
        index.update({k: name for k in part})
    if shards > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))


def _write_config(out: Path, config_data: dict[str, Any], model: torch.nn.Module, qc: dict[str, Any] | None,
                  legacy_cfg: dict[str, Any] | None) -> None:
    """config.json with the declaration in it (ModelOpt's legacy one beside it)."""
    cfg = dict(config_data)
    cfg.pop("quantization_config", None)
    cfg["tie_word_embeddings"] = bool(getattr(model.config, "tie_word_embeddings", False))  # as the tensors are written
    if qc is not None:
        cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    if legacy_cfg is not None:
        (out / HF_QUANT_CONFIG).write_text(json.dumps(legacy_cfg, indent=1))
