"""pcg_core/quant/twin.py: the float twin of a quantized model — every quantized layer the float layer it stands
for — which the judge's float32 padding check runs for quantized cells (harness/cell/judge/padding.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.cards import find_card
from pcg_core import CaptureConfig, Engine, EngineConfig
from pcg_core.model import load_model
from pcg_core.quant import get_scheme, quantize_model
from pcg_core.quant import twin as twin_mod
from pcg_core.quant.layers.experts import PROJECTIONS, dequantized_experts_weight
from pcg_core.quant.twin import float_twin

# On CPU in float32 the weight-only quantized model is its twin's math up to summation order (~1e-6). mxfp4: gpt-oss
# only (the other tiny widths are not multiples of its 32-wide blocks).
WEIGHT_ONLY = ["awq", "gptq", "nvfp4", "mxfp4"]
WITH_ACTIVATIONS = ["fp8_per_token", "fp8_block", "int8_w8a8", "w4a8", "w4afp8"]


def _quantized(model: str, scheme: str, dtype: torch.dtype = torch.float32):
    """The tiny float model and a quantized copy, loaded in `dtype` then quantized as a cell does (codes and scales
    in their own dtypes)."""
    lm = load_model(find_card(model).config, tiny=True, dtype=dtype, device="cpu", seed=0)
    q = copy.deepcopy(lm.model)
    if scheme != "none":
        quantize_model(q, get_scheme(scheme))
    return lm, q


def _logprobs(model: torch.nn.Module, prompt: list[int], dtype: str = "float32") -> torch.Tensor:
    """Prompt logprobs through an eager engine (the model's attention runs inside one)."""
    engine = Engine(model, EngineConfig(attention="sdpa", capture=CaptureConfig(backend="disabled", max_tokens=64),
                                        kv_slots=256, dtype=dtype))
    return torch.tensor(engine.generate([prompt], max_new_tokens=1, prompt_logprobs=True)[0].prompt_logprobs[1:])


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def _holds_codes(model: torch.nn.Module) -> bool:
    return any(getattr(m, "quant_scheme", None) is not None for m in model.modules())


def _quantizers_left(model: torch.nn.Module) -> list[str]:
    """Modules that still run quantized: quantized linears or experts that are not a twin's."""
    return [n for n, m in model.named_modules() if n and (twin_mod._quantized_linear(m) or twin_mod._quantized_experts(m))
            and not getattr(m, "float_twin", False)]


def _as_linear(module: torch.nn.Module) -> torch.nn.Linear:
    w = module.dequantized_weight().float()
    bias = getattr(module, "bias", None)
    lin = torch.nn.Linear(module.in_features, module.out_features, bias=bias is not None, dtype=torch.float32)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias is not None:
            lin.bias.copy_(bias.float())
    return lin


def _independent_twin(q: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy made without twin.py: every quantized experts module given float32 parameters of its
    dequantized weights (its own layout) and run by its float forward (transformers'), every quantized linear an
    nn.Linear of its dequantized weight, then .float()."""
    ref = copy.deepcopy(q)
    for name, m in list(ref.named_modules()):
        if twin_mod._quantized_experts(m):
            for proj in PROJECTIONS:
                if isinstance(getattr(m, proj, None), torch.Tensor):
                    w = dequantized_experts_weight(m, proj, torch.float32)
                    m._buffers.pop(proj, None)
                    m.register_parameter(proj, torch.nn.Parameter(w, requires_grad=False))
            m.quant_scheme = None
        elif twin_mod._quantized_linear(m) and name:
            parent, _, child = name.rpartition(".")
            setattr(ref.get_submodule(parent) if parent else ref, child, _as_linear(m))
    return ref.float()


def _classes(model: torch.nn.Module) -> list[tuple[type, set[str]]]:
    """Each module's class and which of the twin's own attributes it holds: unchanged when the twin is built."""
    return [(type(m), set(m.__dict__) & {"forward", "float_twin", "_apply"}) for m in model.modules()]


def _shares_every_weight(twin: torch.nn.Module, model: torch.nn.Module) -> bool:
    """Every parameter of the twin is the model's own tensor, and so is every buffer but the float32 ones standing
    for the model's half-precision buffers (rotary tables): no weight copied."""
    held = {id(t) for t in [*model.parameters(), *model.buffers()]}
    extra = [b for b in twin.buffers() if id(b) not in held]
    half = sum(b.numel() for b in model.buffers() if b.dtype in (torch.bfloat16, torch.float16))
    return all(id(p) in held for p in twin.parameters()) and all(b.dtype == torch.float32 for b in extra) \
        and sum(b.numel() for b in extra) <= half


@pytest.mark.parametrize("model,scheme", [(m, s) for m in ["qwen3-30b-a3b", "gpt-oss-120b", "grok-2"]
                                           for s in WEIGHT_ONLY + WITH_ACTIVATIONS if s != "mxfp4" or m == "gpt-oss-120b"])
def test_the_twin_is_the_quantized_model_without_its_quantizers(model, scheme):
    """No quantizer is left and no tensor copied (codes and float weights shared with the quantized model); the twin
    computes what an independent float32 copy computes (experts dequantized into float32 parameters, transformers'
    float forward; linears dequantized into nn.Linear); weight-only, what the quantized model computes; with 8-bit
    activations it differs from it (their quantization is gone), and from the float model (the weights are the
    dequantized ones)."""
    lm, q = _quantized(model, scheme)
    prompt = torch.randint(0, lm.config.vocab_size, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    classes, quant = _classes(q), _logprobs(q, prompt)
    twin = float_twin(q)
    assert _holds_codes(q) and _quantizers_left(q) and not _quantizers_left(twin)
    assert _shares_every_weight(twin, q)
    got, base = _logprobs(twin, prompt), _logprobs(lm.model, prompt)
    assert _classes(q) == classes and torch.equal(_logprobs(q, prompt), quant)  # the caller's model untouched
    assert _gap(got, _logprobs(_independent_twin(q), prompt)) < 1e-4
    if scheme in WEIGHT_ONLY:
        assert _gap(got, quant) < 1e-4, _gap(got, quant)
    else:  # its activation quantizers gone (at these tiny, peaked widths they move logprobs by up to ~3)
        assert _gap(got, quant) > 1e-3
    assert _gap(got, base) > 1e-4  # the dequantized weights, not the float ones


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "gpt-oss-120b", "grok-2", "deepseek-v3", "llama-3.1-8b"])
@pytest.mark.parametrize("scheme", ["none", "fp8_block"])
def test_a_half_precision_twin_computes_in_float32_without_copying_a_weight(model, scheme):
    """A bf16 model's twin shares its weights and still computes the float32 model: what .float() of a copy computes
    (experts routed instead of run dense: rounding apart), not the bf16 model (an MLA's absorbed kv_b_proj, read as
    a matrix, included: DeepSeek-V3)."""
    lm, half = _quantized(model, scheme, torch.bfloat16)
    prompt = torch.randint(0, lm.config.vocab_size, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    classes, own = _classes(half), _logprobs(half, prompt, "bfloat16")
    twin = float_twin(half)
    assert _shares_every_weight(twin, half)
    got = _logprobs(twin, prompt)
    assert _gap(got, _logprobs(_independent_twin(half), prompt)) < 1e-4
    assert _gap(got, own) > 1e-3  # bf16's own rounding
    with pytest.raises(RuntimeError, match="shares its model's tensors"):
        twin.float()  # would convert the shared parameters in place
    assert _classes(half) == classes and torch.equal(_logprobs(half, prompt, "bfloat16"), own)  # untouched


@pytest.mark.parametrize("model,scheme", [("qwen3-30b-a3b", "awq"), ("qwen3-30b-a3b", "none"), ("gpt-oss-120b", "none")])
def test_a_twin_built_from_the_wrong_weights_is_told_apart(monkeypatch, model, scheme):
    """Planted: a twin whose experts' weights (dequantized, or the float ones: gpt-oss's transposed) have their
    input channels reversed."""
    from pcg_core.quant.layers import experts as quant_experts

    _, q = _quantized(model, scheme, torch.bfloat16)
    prompt = list(range(3, 15))
    good = _logprobs(float_twin(q), prompt)
    if scheme == "none":
        real = twin_mod.canonical_weight
        monkeypatch.setattr(twin_mod, "canonical_weight", lambda m, name, e: real(m, name, e).flip(-1))
    else:
        real = quant_experts.expert_weight
        monkeypatch.setattr(quant_experts, "expert_weight",
                            lambda m, name, e, dtype=torch.float32: real(m, name, e, dtype).flip(-1))
    assert _gap(_logprobs(float_twin(q), prompt), good) > 1e-3


def test_an_unknown_module_holding_8bit_codes_is_refused():
    """A module with float8 weights that is neither a quantized linear nor experts: its codes are not a float weight."""
    lm, _ = _quantized("qwen3-0.6b", "none", torch.bfloat16)
    lm.model.lm_head.weight.data = lm.model.lm_head.weight.data.to(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match=r"lm_head\.weight is torch\.float8_e4m3fn"):
        float_twin(lm.model)


def test_a_slot_routed_nowhere_is_skipped_like_a_zero_weight():
    """routed_float_experts_forward: a top-k slot holding an id outside the experts (-1) adds nothing, as one routed
    to a real expert with weight 0 does (within rounding: that expert's GEMM has one row more); a token's experts
    summed in expert order whatever their slots' order, bitwise."""
    _, q = _quantized("qwen3-30b-a3b", "fp8_per_token")
    experts = next(m for m in float_twin(q).modules() if twin_mod._quantized_experts(m))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, experts.gate_up_proj.shape[-1], generator=g)
    index = torch.randint(0, experts.num_experts, (6, 2), generator=g)
    weights = torch.rand(6, 2, generator=g)
    nowhere, zero = index.clone(), weights.clone()
    nowhere[0, 1], zero[0, 1] = -1, 0.0
    got = twin_mod.routed_float_experts_forward(experts, x, nowhere, weights)
    assert torch.allclose(got, twin_mod.routed_float_experts_forward(experts, x, index, zero), atol=1e-6)
    assert torch.equal(twin_mod.routed_float_experts_forward(experts, x, index.flip(1), weights.flip(1)),
                       twin_mod.routed_float_experts_forward(experts, x, index, weights))  # the same sums, in order
    assert not torch.allclose(got, twin_mod.routed_float_experts_forward(experts, x, index, weights), atol=1e-6)
