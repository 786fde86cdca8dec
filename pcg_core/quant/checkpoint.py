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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.formats import HF_QUANT_CONFIG, QuantSpec, declaration
from pcg_core.quant.linear import QuantLinear
from pcg_core.quant.schemes import Scheme, quantize_weight

_EIGHT_BIT = (torch.float8_e4m3fn, torch.int8)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.\d+\.")


@dataclass
class LoadReport:
    quantized: list[str] = field(default_factory=list)  # linears swapped for QuantLinear
    unquantized: list[str] = field(default_factory=list)  # linears the checkpoint keeps in 16 bits
    skipped_layers: int = 0  # tensors of layers past the ones kept


class _Tensors:
    """Every tensor of a checkpoint's safetensors files, read on demand; remembers which were used."""

    def __init__(self, path: Path):
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise UnsupportedModel(f"{path}: no .safetensors files")
        self._where: dict[str, Path] = {}
        for f in files:
            with safe_open(f, framework="pt") as h:
                for k in h.keys():
                    self._where[k] = f
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def keys(self) -> list[str]:
        return list(self._where)

    def get(self, key: str) -> torch.Tensor:
        self.used.add(key)
        with safe_open(self._where[key], framework="pt") as h:
            return h.get_tensor(key)


def load_quantized(model: torch.nn.Module, path: str | Path, spec: QuantSpec, layers: int | None = None) -> LoadReport:
    """Fill `model` (transformers' class, built for the config) from the quantized checkpoint at `path`."""
    path = Path(path)
    tensors, report = _Tensors(path), LoadReport()
    for name, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or f"{name}.weight" not in tensors:
            continue
        w = tensors.get(f"{name}.weight")
        if w.dtype not in _EIGHT_BIT:
            report.unquantized.append(name)
            continue
        if spec.ignored(name):
            raise UnsupportedModel(f"{path}: {name}.weight is stored in {w.dtype} but {spec.where} lists {name} as not quantized")
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, _quant_linear(mod, w, tensors, name, spec, path))
        report.quantized.append(name)
    _load_rest(model, tensors, path, report)
    _check_all_used(tensors, path, layers, report)
    if not report.quantized:
        raise UnsupportedModel(f"{path}: {spec.where} declares {spec.format} ({spec.scheme.name}) but no linear layer's weight "
                               "is stored in 8 bits; the declaration or the files are wrong")
    return report


def _quant_linear(mod: torch.nn.Linear, w: torch.Tensor, tensors: _Tensors, name: str, spec: QuantSpec, path: Path) -> QuantLinear:
    s: Scheme = spec.scheme
    dev = mod.weight.device
    q = QuantLinear(mod.in_features, mod.out_features, s, mod.bias is not None, dev, mod.weight.dtype)
    if w.dtype != s.qdtype or tuple(w.shape) != tuple(q.weight.shape):
        raise UnsupportedModel(f"{path}: {name}.weight is {w.dtype} {tuple(w.shape)}; {spec.format} {s.name} needs "
                               f"{s.qdtype} {tuple(q.weight.shape)}")
    q.weight.copy_(w)
    key = f"{name}.{spec.weight_scale_name}"
    if key not in tensors:
        raise UnsupportedModel(f"{path}: {name}.weight is quantized but {key} is missing")
    q.weight_scale.copy_(_shaped(tensors.get(key), q.weight_scale.shape, key, path))
    key = f"{name}.input_scale"
    if q.input_scale is not None:
        if key not in tensors:
            raise UnsupportedModel(f"{path}: {s.name} has static activation scales but {key} is missing")
        q.input_scale.copy_(_shaped(tensors.get(key), (), key, path))
    elif key in tensors:
        raise UnsupportedModel(f"{path}: {key} is a static activation scale, but {spec.where} declares dynamic activations")
    if mod.bias is not None:
        q.bias.copy_(tensors.get(f"{name}.bias"))
    return q


def _shaped(t: torch.Tensor, shape: tuple[int, ...], key: str, path: Path) -> torch.Tensor:
    """A scale in the shape the scheme uses: same elements in another layout ([N] for [N, 1], [1] for a scalar)
    is accepted; anything else (a transposed block scale included) is an error."""
    numel = 1
    for d in shape:
        numel *= d
    squeezed = [d for d in t.shape if d != 1]
    want = [d for d in shape if d != 1]
    if t.numel() != numel or squeezed != want:
        raise UnsupportedModel(f"{path}: {key} has shape {tuple(t.shape)}; expected {tuple(shape)}")
    if not t.dtype.is_floating_point:
        raise UnsupportedModel(f"{path}: {key} is {t.dtype}; scales are floating point")
    return t.float().reshape(shape)


def _load_rest(model: torch.nn.Module, tensors: _Tensors, path: Path, report: LoadReport) -> None:
    """Every other tensor of the model's state dict, from the file of the same name (tied weights follow)."""
    quant = set(report.quantized)
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if getattr(model.config, "tie_word_embeddings", False) else set()
    state = model.state_dict()
    for key, param in state.items():
        if key.rpartition(".")[0] in quant:
            continue
        if key not in tensors:
            if key in tied:
                continue
            raise UnsupportedModel(f"{path}: the model needs {key}, which the checkpoint does not have"
                                   + _experts_hint(tensors))
        t = tensors.get(key)
        if tuple(t.shape) != tuple(param.shape):
            raise UnsupportedModel(f"{path}: {key} is {tuple(t.shape)} on disk, the model's is {tuple(param.shape)}")
        if t.dtype in _EIGHT_BIT:
            raise UnsupportedModel(f"{path}: {key} is stored in {t.dtype} but is not a linear layer's weight this loader "
                                   "quantizes" + _experts_hint(tensors))
        with torch.no_grad():
            param.copy_(t.to(param.dtype))


def _experts_hint(tensors: _Tensors) -> str:
    if any(_EXPERT.search(k) for k in tensors.keys()):
        return " (quantized per-expert MoE weights are not supported by this loader yet)"
    return ""


def _check_all_used(tensors: _Tensors, path: Path, layers: int | None, report: LoadReport) -> None:
    left = []
    for k in tensors.keys():
        if k in tensors.used:
            continue
        m = _LAYER.match(k)
        if layers is not None and m and int(m.group(1)) >= layers:
            report.skipped_layers += 1
            continue
        left.append(k)
    if any(k.endswith(("k_scale", "v_scale")) for k in left):
        raise UnsupportedModel(f"{path}: holds FP8 KV-cache scales (k_scale/v_scale); this runtime does not apply them yet")
    if left:
        raise UnsupportedModel(f"{path}: {len(left)} tensors the model does not use, e.g. {', '.join(sorted(left)[:4])}: a "
                               "different architecture or an unsupported quantization layout" + _experts_hint(tensors))


# Writing ----------------------------------------------------------------------------------------------------
def write_checkpoint(model: torch.nn.Module, config_data: dict[str, Any], out_dir: str | Path, fmt: str, scheme: Scheme,
                     *, legacy: bool = False, ignore: tuple[str, ...] = ("lm_head",), shards: int = 1,
                     input_absmax: dict[str, float] | None = None) -> Path:
    """`model`'s float weights quantized with `scheme` and written as `fmt`'s producer writes them: tensor names,
    dtypes and shapes, config.json's quantization_config (or ModelOpt's legacy hf_quant_config.json). A static
    scheme needs each linear's calibrated input absmax (calibrate.record_input_absmax). Test utility and
    synthetic-checkpoint maker; nothing here is read back by the loader except through the files."""
    if not scheme.act_dynamic and input_absmax is None:
        raise ValueError(f"{scheme.name} has static activation scales: pass input_absmax from a calibration run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    qc, legacy_cfg = declaration(fmt, scheme, ignore, legacy)
    scale_name = "weight_scale_inv" if fmt == "fp8" else "weight_scale"
    tensors: dict[str, torch.Tensor] = {}
    linears = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear and not n.endswith(ignore)}
    for key, t in model.state_dict().items():
        mod = key.rpartition(".")[0]
        if mod in linears and key.endswith(".weight"):
            q, s = quantize_weight(t, scheme)
            tensors[key] = q.contiguous()
            if fmt == "modelopt" and scheme.weights == "channel":
                s = s.reshape(-1)  # ModelOpt writes per-channel scales flat
            tensors[f"{mod}.{scale_name}"] = s.reshape(s.shape or (1,)) if fmt == "compressed-tensors" else s.contiguous()
            if not scheme.act_dynamic:
                tensors[f"{mod}.input_scale"] = torch.tensor(max(input_absmax[mod], 1e-6) / scheme.qmax)
        else:
            tensors[key] = t.detach().clone().contiguous()
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
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
    cfg = dict(config_data)
    cfg.pop("quantization_config", None)
    cfg["tie_word_embeddings"] = bool(getattr(model.config, "tie_word_embeddings", False))  # as the tensors are written
    if qc is not None:
        cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    if legacy_cfg is not None:
        (out / HF_QUANT_CONFIG).write_text(json.dumps(legacy_cfg, indent=1))
    return out
