"""The float twin of a model: the float32 model it stands for, sharing its tensors — every quantized layer the
float layer it stands for (weights dequantized, activations no longer quantized), every half-precision weight read
in float32.

Why: the judge tells padding *noise* from a padding *leak* by running the model in float32, padded and unpadded
(harness/cell/judge/padding.py), where rounding differs by ~1e-7 and a leak keeps its size. A quantized model cannot
show that: its activation quantizers turn a 1e-7 change into a whole rounding step. Every activation quantizer
here is row-local (per token, per token and 128-group, or a static scale), so padding rows cannot reach real
rows through them; whatever else the model does with padding is the same in the twin, which has no quantizer.

The twin copies no weight: it runs beside the cell's own model on a GPU that several cells share, where a float32
copy did not fit (DeepSeek-V3 at 4 layers, 8-bit: ~15 GB of float32 linears, embedding and head beside a 48 GB
cell, three cells on the H200; a float32 copy of its experts alone would be 45 GB). Every tensor is shared with the
model; a module reads each of its half-precision parameters as a float32 copy made when read and freed after use, a
quantized linear dequantizes its weight in float32 when it runs, and experts (quantized or not) run
`routed_float_experts_forward`: each routed expert's weight in float32 when it runs (float experts run dense would
also compute every expert on every token). The twin is only ever run eagerly, so which experts run may be read on
the host.
"""

from __future__ import annotations

import copy
import types
from typing import TypeVar, cast

import torch

from pcg_core.quant.layers import experts as quant_experts
from pcg_core.split_ops import rebind_copies
from pcg_core.quant.layers.expert_layout import (add_bias, add_rows, canonical_weight, expert_rows, first_projection,
                                                 gate, rows_of)
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.layers.int4_linear import Int4Linear
from pcg_core.quant.layers.linear import QuantLinear, reference_forward, scheme_of


def _quantized_linear(module: torch.nn.Module) -> bool:
    """QuantLinear, Int4Linear (W4A8Linear), Fp4Linear: a layer that holds codes and can give its float weight
    (known by that, not by a scheme: an Int4Linear built from its weight alone carries none)."""
    return not isinstance(module, torch.nn.Linear) and callable(getattr(module, "dequantized_weight", None)) \
        and hasattr(module, "in_features") and hasattr(module, "out_features")


def _quantized_experts(module: torch.nn.Module) -> bool:
    return scheme_of(module) is not None and hasattr(module, "num_experts")


def _dequantized_linear_forward(self: QuantLinear | Int4Linear | Fp4Linear, x: torch.Tensor) -> torch.Tensor:
    """A quantized linear's float layer: x times its weight dequantized in float32, plus its bias; no activation
    quantizer."""
    bias = getattr(self, "bias", None)
    return torch.nn.functional.linear(x.float(), self.dequantized_weight().float(),
                                      None if bias is None else bias.float())


def _embedding_forward(self: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """The rows looked up in the shared half-precision table, then made float32: the same values bitwise as a
    lookup in a float32 table, without a float32 copy of the whole table (3.7 GB for DeepSeek-V3's) per forward."""
    weight = cast(torch.Tensor, self._parameters["weight"])  # torch types a registered parameter Optional
    return torch.nn.functional.embedding(ids, weight, self.padding_idx).float()


def _refuse_apply(self: torch.nn.Module, fn, recurse: bool = True):
    raise RuntimeError("a float twin shares its model's tensors: .to()/.float()/.cuda() on it would convert the "
                       "model's own parameters; convert the model, then build its twin")


M = TypeVar("M", bound=torch.nn.Module)  # a twin is a copy of its model's own class

_FLOAT32_CLASSES: dict[tuple[type, tuple[str, ...]], type] = {}


def _float32_class(cls: type, names: tuple[str, ...]) -> type:
    """`cls` with each parameter in `names` read as a float32 copy (a property over the shared parameter, which
    stays registered: the module's parameters() and state_dict are the model's). Made here, so a twin does not
    pickle (it is never saved: it lives as long as one padding check)."""
    key = (cls, names)
    if key not in _FLOAT32_CLASSES:
        props = {n: _float32_read(n) for n in names}
        _FLOAT32_CLASSES[key] = type(cls.__name__, (cls,), {**props, "__module__": cls.__module__})
    return _FLOAT32_CLASSES[key]


def _float32_read(name: str) -> property:
    return property(lambda self: self._parameters[name].float())


_HALF = (torch.bfloat16, torch.float16)


def _read_in_float32(name: str, module: torch.nn.Module) -> None:
    """Make `module` (not its children) compute in float32: its half-precision parameters read as float32 copies,
    its half-precision buffers (small: rotary tables) replaced by float32 ones of its own. Any other non-float32
    floating tensor (8-bit codes) belongs to a quantized module this file does not know: refused, never read as
    if it were the float weight."""
    for n, t in [*module._parameters.items(), *module._buffers.items()]:
        if t is not None and t.is_floating_point() and t.dtype not in (torch.float32, *_HALF):
            raise NotImplementedError(f"float twin: {name or '(root)'}.{n} is {t.dtype}, held by a "
                                      f"{type(module).__name__} that is neither a quantized linear nor experts")
    names = tuple(n for n, p in module._parameters.items() if p is not None and p.dtype in _HALF)
    if names:
        if type(module) is torch.nn.Embedding and module.max_norm is None:
            setattr(module, "forward", types.MethodType(_embedding_forward, module))  # this instance's own forward
        module.__class__ = _float32_class(type(module), names)
    for n, b in module._buffers.items():
        if b is not None and b.dtype in _HALF:
            module._buffers[n] = b.float()


def _reference_linear_forward(self: QuantLinear | Int4Linear | Fp4Linear, x: torch.Tensor) -> torch.Tensor:
    """A quantized linear's reference math (its op's plain implementation: the activation quantized as the
    kernel quantizes it, the weight dequantized, float32 accumulation), whatever device it is on: what its kernel
    is held to."""
    lead = x.shape[:-1]
    out = reference_forward(self, x.reshape(-1, self.in_features))
    return out.reshape(*lead, self.out_features)


def float_twin(model: M) -> M:
    """The float32 model `model` stands for, sharing every tensor with it (none copied): quantized linears run
    dequantized, experts run routed_float_experts_forward (`float_twin` set), every other module reads its
    half-precision parameters as float32. The caller's model is not touched; the twin refuses to be converted
    (.to(), .float(): that would convert the shared tensors)."""
    return _twin(model, float32=True, quantized=_dequantized_linear_forward)


def reference_twin(model: M, float32: bool = False) -> M:
    """The model with every kernel replaced by the math it is held to, sharing every tensor (none copied):
    quantized linears run their reference (`reference_forward`), quantized experts their reference over the routed
    experts alone (`reference_math` set: expert_layout.expert_rows), unquantized experts routed_float_experts_forward. With `float32` every other module
    reads its half-precision parameters as float32 too: the reference without half-precision rounding, to measure
    how much that rounding alone moves it. Why: a kernel that is wrong in eager is wrong under graphs alike, so
    graph = eager cannot see it; the judge's reference layer (harness/cell/judge/reference.py) holds eager to this."""
    return _twin(model, float32=float32, quantized=_reference_linear_forward)


def _twin(model: M, float32: bool, quantized) -> M:
    twin = copy.deepcopy(model, {id(t): t for t in [*model.parameters(), *model.buffers()]})
    rebind_copies(twin)  # a module a split op runs (expert-parallel dispatch): the twin's own, not the model's
    reference = quantized is _reference_linear_forward
    for name, module in twin.named_modules():
        if _quantized_experts(module) and reference:
            module.reference_math = True
        elif quant_experts.is_experts(module) or _quantized_experts(module):
            module.float_twin = True
        elif _quantized_linear(module):
            module.float_twin = True
            # a row-parallel shard (pcg_core.distributed) sums its local output over ranks in `forward`: its local
            # part is what the twin replaces
            setattr(module, "local_forward" if getattr(module, "row_parallel", False) else "forward",
                    types.MethodType(quantized, module))
        elif float32:
            _read_in_float32(name, module)
        module._apply = types.MethodType(_refuse_apply, module)
    return twin


def _expert_weight(module: torch.nn.Module, name: str, e: int) -> torch.Tensor:
    """Expert e's weight [N, K] of projection `name` in float32: dequantized, or the float module's own."""
    if getattr(module, "quant_scheme", None) is not None:
        return quant_experts.expert_weight(module, name, e)
    return canonical_weight(module, name, e).float()


@torch.no_grad()
def routed_float_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                 top_k_weights: torch.Tensor) -> torch.Tensor:
    """The float experts these (quantized or not) stand for, in float32: each routed expert's tokens through its
    weights in float32 (dequantized: experts.expert_weight), biases added, the module's own gate or activation, no
    activation quantizer; each token's experts summed in expert order (expert_rows, routed: eager only)."""
    first, gated = first_projection(module)
    x = hidden_states.float()
    out = torch.zeros_like(x)
    for e, rows, weight in expert_rows(module, top_k_index, top_k_weights, routed=True):
        h = add_bias(rows_of(x, rows) @ _expert_weight(module, first, e).t(), module, first, e)
        h = gate(module, h, gated)
        y = add_bias(h @ _expert_weight(module, "down_proj", e).t(), module, "down_proj", e)
        add_rows(out, rows, y * weight.float())
    return out.to(hidden_states.dtype)
