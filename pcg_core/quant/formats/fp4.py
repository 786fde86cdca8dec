"""NVFP4 weight checkpoints (ModelOpt, compressed-tensors nvfp4-pack-quantized): reading a linear's tensors into
Fp4Linear, and writing them for synthetic checkpoints in the producers' exact layouts.

Both formats convert into schemes/fp4.py's canonical `Fp4Weight` at load (ModelOpt's global multiplies, compressed-tensors'
divides), so nothing past the loader knows which producer wrote a weight. The rule that keeps weights honest is
the int4 loader's: a linear is quantized exactly when its packed tensor is in the files (ModelOpt: `weight` stored
as uint8; compressed-tensors: `weight_packed`), and then every companion tensor must be there in the shape and
dtype the format gives it; a linear stored in 16 bits is kept in 16 bits.

Both formats can declare W4A4 (ModelOpt NVFP4's `input_scale`, compressed-tensors NVFP4's `input_global_scale`).
Hopper has no FP4 MMA, so this runtime runs every FP4 checkpoint as W4A16: the activation scale must be there
and valid (the files are what they say), and is not applied — numerics then differ from a Blackwell W4A4 run, as
they do in vLLM's and SGLang's Hopper fallbacks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pcg_core.errors import ConfigError, UnsupportedModel
from pcg_core.quant.formats.files import CheckpointTensors
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.schemes.fp4 import (E2M1_MAX, E4M3_MAX, NVFP4_BLOCK, Fp4Scheme, Fp4Weight, ct_nvfp4_pack,
                                        ct_nvfp4_unpack, modelopt_nvfp4_pack, modelopt_nvfp4_unpack)

FP4_FORMATS = ("modelopt", "compressed-tensors")
# The tensor whose presence says a linear is quantized, per format (ModelOpt's only when stored as uint8).
PACKED = {"modelopt": "weight", "compressed-tensors": "weight_packed"}
# The activation (W4A4) scale each format stores beside a quantized linear.
ACT_SCALE = {"modelopt": "input_scale", "compressed-tensors": "input_global_scale"}
# What the writer stores as ModelOpt's input_scale: amax/(448·6) for an activation absmax of 1 (never applied).
SYNTHETIC_INPUT_SCALE = 1.0 / (E4M3_MAX * E2M1_MAX)


@dataclass(frozen=True)
class Fp4Format:
    """How one checkpoint stores its NVFP4 linears: the format (FP4_FORMATS) and whether it declares W4A4, so
    that each quantized linear carries an activation scale (ACT_SCALE)."""

    name: str
    act_scale: bool

    def packed_key(self, module: str) -> str:
        return f"{module}.{PACKED[self.name]}"

    def is_packed(self, tensors: CheckpointTensors, module: str) -> bool:
        """Whether the files hold `module` (as they spell it) in FP4, read from the header (no tensor loaded)."""
        key = self.packed_key(module)
        return key in tensors and (self.name != "modelopt" or tensors.stored_dtype(key) == "U8")


# --- reading --------------------------------------------------------------------------------------------------


def read_fp4_linear(mod: torch.nn.Linear, name: str, tensors: CheckpointTensors, fmt: Fp4Format,
                    scheme: Fp4Scheme) -> Fp4Linear:
    """The linear `name` (as the files spell it) from its NVFP4 tensors; every error names the tensor."""
    w = read_fp4_weight(name, tensors, fmt, (mod.out_features, mod.in_features))
    bias = tensors.get(f"{name}.bias") if mod.bias is not None else None
    out = Fp4Linear.from_weight(w, bias, mod.weight.dtype).to(mod.weight.device)
    out.quant_scheme = scheme  # what the cell reads back: the name the matrix's quant axis uses
    return out


def read_fp4_weight(name: str, tensors: CheckpointTensors, fmt: Fp4Format, shape: tuple[int, int]) -> Fp4Weight:
    """The canonical weight of the linear `name` (as the files spell it: a layer's linear or one expert's
    projection), checked against the (N, K) the model expects."""
    path = tensors.path

    def need(suffix: str) -> torch.Tensor:
        return tensors.companion(fmt.packed_key(name), f"{name}.{suffix}", f"{fmt.name} NVFP4")

    def refuse(suffix: str, why: str) -> None:
        if f"{name}.{suffix}" in tensors:
            raise UnsupportedModel(f"{path}: {name}.{suffix} is there, but {why}")

    act = ACT_SCALE[fmt.name]
    if not fmt.act_scale:
        refuse(act, "the checkpoint declares no quantized activations (W4A16)")
    try:
        if fmt.name == "modelopt":
            refuse("pre_quant_scale", "NVFP4-AWQ (an activation pre-scale per input channel) is not read yet")
            w = modelopt_nvfp4_unpack(need("weight"), need("weight_scale"), need("weight_scale_2"),
                                      need(act) if fmt.act_scale else None)
        else:
            refuse("weight_zero_point", "NVFP4 weights are symmetric (no zero points)")
            w = ct_nvfp4_unpack(need("weight_packed"), need("weight_scale"), need("weight_global_scale"),
                                need(act) if fmt.act_scale else None)
            if f"{name}.weight_shape" in tensors:  # not written by compressed-tensors' NVFP4 compressor; checked if there
                stored = tuple(int(d) for d in tensors.get(f"{name}.weight_shape").tolist())
                if stored != tuple(w.codes.shape):
                    raise ConfigError(f"weight_shape {stored} does not match weight_packed's {tuple(w.codes.shape)}")
    except ConfigError as e:
        raise UnsupportedModel(f"{path}: {name}: {e}") from e
    if tuple(w.codes.shape) != tuple(shape):
        raise UnsupportedModel(f"{path}: {name}'s FP4 tensors hold a {tuple(w.codes.shape)} weight; the model's linear is "
                               f"{tuple(shape)}")
    return w


# --- writing --------------------------------------------------------------------------------------------------


def fp4_tensors(weight: Fp4Weight, fmt: Fp4Format) -> dict[str, torch.Tensor]:
    """A linear's tensors (suffix → tensor) as `fmt`'s producer writes them (contiguous, as safetensors needs)."""
    if fmt.name == "modelopt":
        out = modelopt_nvfp4_pack(weight, SYNTHETIC_INPUT_SCALE if fmt.act_scale else None)
    else:
        out = ct_nvfp4_pack(weight)
        if fmt.act_scale:
            out["input_global_scale"] = torch.tensor([1.0 / SYNTHETIC_INPUT_SCALE])  # the reciprocal, as its global
    return {k: v.contiguous() for k, v in out.items()}


def declaration(fmt: Fp4Format, ignore: tuple[str, ...], legacy: bool = False) -> tuple[dict | None, dict | None]:
    """(config.json quantization_config, hf_quant_config.json) as each producer writes an NVFP4 checkpoint."""
    if fmt.name == "modelopt":
        if not fmt.act_scale:
            raise ValueError("ModelOpt NVFP4 checkpoints carry input_scale (W4A4 declared)")
        q = {"quant_algo": "NVFP4", "group_size": NVFP4_BLOCK, "kv_cache_quant_algo": None,
             "exclude_modules": list(ignore)}
        if legacy:
            return None, {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": q}
        return {"quant_method": "modelopt", **q}, None
    if fmt.name == "compressed-tensors":
        weights = {"num_bits": 4, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor_group",
                   "group_size": NVFP4_BLOCK}
        acts = dict(weights, dynamic="local") if fmt.act_scale else None
        return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                "quantization_status": "compressed", "ignore": list(ignore), "kv_cache_scheme": None,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                              "format": "nvfp4-pack-quantized"}}}, None
    raise ValueError(f"no FP4 writer for format {fmt.name!r} (have: {', '.join(FP4_FORMATS)})")
