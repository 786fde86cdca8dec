"""Grok-2: our own module (pcg_core/model/grok.py) against a hand-written forward and the published formulas, and
the engine's graph paths against the module's own eager attention, with planted faults."""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from pcg_core import CaptureConfig, Engine, EngineConfig, load_model
from pcg_core.attention.reference import length_temperature
from pcg_core.capabilities import attention_unsupported_reason
from pcg_core.errors import ConfigError, UnsupportedModel
from pcg_core.model import grok
from pcg_core.model.loader import build_config, pretrained_model
from pcg_helpers import transformers_prompt_logprobs

PROMPT = list(range(3, 45))  # past the tiny length temperature (16) from position 17 on


@pytest.fixture(scope="module")
def real(configs):
    return json.loads((configs / "xai-org__grok-2.json").read_text())


@pytest.fixture(scope="module")
def model(real):
    lm = load_model(real, tiny=True)
    return lm, transformers_prompt_logprobs(lm, PROMPT)


def _ours(lm, prompt, backend="piecewise", attention="sdpa"):
    engine = Engine(lm.model, EngineConfig(attention=attention, capture=CaptureConfig(backend=backend, max_tokens=64),
                                           kv_slots=256))
    return engine.generate([prompt], max_new_tokens=2, prompt_logprobs=True)[0].prompt_logprobs


def _gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def test_git_model_type_is_read_as_grok_not_microsofts_git(real):
    assert real["model_type"] == "git"
    config = build_config(real)
    assert type(config) is grok.Grok1Config and config.model_type == "pcg_grok1"
    assert (config.attn_logit_softcapping, config.final_logit_softcapping, config.attn_temperature_len) == (30.0, 50, 1024)
    assert config.embedding_multiplier_scale == pytest.approx(math.sqrt(8192)) and config.output_multiplier_scale == 0.5
    with pytest.raises(ConfigError, match="rope_type 'yarn'"):
        build_config({**real, "rope_type": "yarn"})


def test_a_grok_checkpoint_is_refused_with_the_reason(real, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(real))
    with pytest.raises(UnsupportedModel, match="TP-8"):
        pretrained_model(str(tmp_path), dtype=torch.float32, device="cpu", layers=1)


def test_published_formulas():
    x = torch.tensor([-100.0, -3.0, 0.0, 3.0, 100.0])
    assert torch.allclose(grok.softcap(x, 30.0), 30 * torch.tanh(x / 30))
    assert torch.equal(grok.softcap(x, 0.0), x)
    # xAI's length temperature, L = 1024: 1 up to and at L, log2(p)/10 past it
    t = length_temperature(torch.tensor([0, 5, 1024, 1025, 2048, 4096]), 1024)
    assert torch.allclose(t, torch.tensor([1, 1, 1, math.log2(1025) / 10, 1.1, 1.2]))
    assert torch.equal(length_temperature(torch.tensor([5000]), 0), torch.ones(1))


def test_router_hand_checked():
    """Four experts, one token whose router logits are 45, 44, 43, -10: capped to 30·tanh(l/30), top-2 of the
    capped logits, weighted by their softmax over all four, not renormalised."""
    cfg = grok.Grok1Config(hidden_size=1, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=2)
    moe = grok.Grok1MoE(cfg).requires_grad_(False)
    raw = [45.0, 44.0, 43.0, -10.0]
    moe.gate.weight.copy_(torch.tensor(raw)[:, None])
    idx, w = moe.route(torch.ones(1, 1))
    capped = [30 * math.tanh(v / 30) for v in raw]
    z = sum(math.exp(c) for c in capped)
    assert idx.tolist() == [[0, 1]]
    assert w[0].tolist() == pytest.approx([math.exp(capped[0]) / z, math.exp(capped[1]) / z], rel=1e-5)
    assert float(w.sum()) < 0.8  # not renormalised over the chosen two (the third keeps its share)


def _hand_forward(model, ids: torch.Tensor) -> torch.Tensor:
    """Grok-2's forward written out from the reference's description, reading the module's weights only."""
    c = model.config
    m = model.model

    def norm(n, x):
        return n.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps))

    t, d = ids.shape[0], c.head_dim
    pos = torch.arange(t).float()
    inv = 1.0 / c.rope_theta ** (torch.arange(0, d, 2).float() / d)
    ang = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)

    def rope(x):  # [T, h, d], neox halves
        half = d // 2
        return x * ang.cos()[:, None] + torch.cat([-x[..., half:], x[..., :half]], -1) * ang.sin()[:, None]

    x = m.embed_tokens.weight[ids] * c.embedding_multiplier_scale
    for layer in m.layers:
        a = layer.self_attn
        h = norm(layer.pre_attn_norm, x)
        q = rope((h @ a.q_proj.weight.T).view(t, -1, d))
        k = rope((h @ a.k_proj.weight.T).view(t, -1, d)).repeat_interleave(c.num_attention_heads // c.num_key_value_heads, 1)
        v = (h @ a.v_proj.weight.T).view(t, -1, d).repeat_interleave(c.num_attention_heads // c.num_key_value_heads, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        s = 30 * torch.tanh(s / 30)
        temp = torch.tensor([math.log2(p) / math.log2(c.attn_temperature_len) if p > c.attn_temperature_len else 1.0
                             for p in range(t)])
        s = (s * temp[None, :, None]).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(t, -1) @ a.o_proj.weight.T
        x = x + norm(layer.post_attn_norm, o)
        h = norm(layer.pre_moe_norm, x)
        moe = layer.block_sparse_moe
        logits = 30 * torch.tanh(h @ moe.gate.weight.T / 30)
        top = logits.topk(2, -1).indices
        probs = logits.softmax(-1)
        routed = torch.zeros_like(h)
        for r in range(t):
            for e in top[r].tolist():
                g, u = (h[r] @ moe.experts.gate_up_proj[e].T).chunk(2)
                routed[r] += probs[r, e] * (moe.experts.down_proj[e] @ (F.gelu(g, approximate="tanh") * u))
        mlp = layer.mlp
        dense = (F.gelu(h @ mlp.gate_proj.weight.T, approximate="tanh") * (h @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
        x = x + norm(layer.post_moe_norm, (dense + routed) / math.sqrt(2))
    h = norm(m.norm, x)
    return 50 * torch.tanh(h @ model.lm_head.weight.T * c.output_multiplier_scale / 50)


def test_module_matches_the_hand_written_forward(model):
    lm, _ = model
    ref = copy.deepcopy(lm.model)
    ref.config._attn_implementation = "eager"  # the module's own attention, outside any engine
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        got = ref(input_ids=ids[None]).logits[0]
        want = _hand_forward(lm.model, ids)
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("backend", ["disabled", "piecewise", "breakable", "full"])
def test_engine_matches_the_modules_eager_attention(model, backend, attention):
    lm, want = model
    assert _gap(_ours(lm, PROMPT, backend, attention), want) < 1e-4  # fp32


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("fault", ["soft-cap dropped", "temperature dropped", "temperature one position late"])
def test_planted_grok_attention_faults_are_caught(model, fault, attention, monkeypatch):
    from pcg_core.attention import op

    real = op.LayerParams

    def faulty(layer, scale, window, softcap, sinks, temperature_len=0, **kw):
        if fault == "soft-cap dropped":
            softcap = 0.0
        elif fault == "temperature dropped":
            temperature_len = 0
        else:
            temperature_len += 1
        return real(layer, scale, window, softcap, sinks, temperature_len=temperature_len, **kw)

    monkeypatch.setattr(op, "LayerParams", faulty)
    lm, want = model
    assert _gap(_ours(lm, PROMPT, backend="disabled", attention=attention), want) > 1e-3, fault


def test_backends_declare_the_length_temperature():
    why = attention_unsupported_reason("varlen", "cuda", ["length_temperature"])
    assert why and "length_temperature" in why
    for name in ("sdpa", "flex"):
        assert attention_unsupported_reason(name, "cpu", ["length_temperature", "softcap"]) is None, name


# Relative error of the quantized experts against the float ones on the same input at the tiny widths (measured
# 0.06 fp8, 0.017 int8, 0.14–0.19 4-bit over three seeds); a fault (codes read as floats, a wrong activation) is
# O(1). mxfp4 needs K in whole blocks of 32: the tiny experts' 48 are not (real widths are).
QUANT_REL = {"fp8_per_token": 0.1, "fp8_block": 0.1, "int8_w8a8": 0.04, "awq": 0.3, "gptq": 0.3, "w4a8": 0.3,
             "w4afp8": 0.3, "nvfp4": 0.3}


def _experts_rel(lm, scheme: str, seed: int = 0) -> float:
    from pcg_core.quant import get_scheme, quantize_model

    float_moe = lm.model.model.layers[0].block_sparse_moe
    q = copy.deepcopy(lm.model)
    quantize_model(q, get_scheme(scheme))
    moe = q.model.layers[0].block_sparse_moe
    assert getattr(moe.experts, "quant_scheme", None) is not None and moe.experts.quant_scheme.name == scheme
    assert type(moe.gate) is grok.Grok1Router and type(q.lm_head) is grok.Grok1Head  # no scheme touches them
    h = torch.randn(24, lm.model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    idx, w = float_moe.route(h)
    want = float_moe.experts(h, idx, w)
    got = moe.experts(h, idx, w)
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("scheme", list(QUANT_REL))
def test_every_scheme_quantizes_grok_experts(model, scheme):
    """Grok's experts hold transformers' fused layout, so each scheme quantizes them and runs them through its own
    forwards (not ours reading codes as floats): close to the float experts, not equal."""
    rel = _experts_rel(model[0], scheme)
    assert 0 < rel < QUANT_REL[scheme], f"{scheme}: {rel:.3g}"


@pytest.mark.parametrize("scheme", ["awq", "gptq"])
def test_quantized_grok_experts_are_the_float_forward_on_dequantized_weights(model, scheme, monkeypatch):
    """Weight-only int4: the quantized experts equal the module's own float forward on the dequantized weights
    (act-order undone), GELU-tanh gate and all; the same with SiLU in place of GELU must not."""
    from pcg_core.quant import get_scheme, quantize_model
    from pcg_core.quant.layers.experts import _all_dequantized

    lm = model[0]
    q = copy.deepcopy(lm.model)
    quantize_model(q, get_scheme(scheme))
    moe = q.model.layers[0].block_sparse_moe
    deq = copy.deepcopy(lm.model.model.layers[0].block_sparse_moe.experts)
    for name in ("gate_up_proj", "down_proj"):
        getattr(deq, name).data = _all_dequantized(moe.experts, name, torch.float32)
    h = torch.randn(24, lm.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    idx, w = moe.route(h)
    want = deq(h, idx, w)
    rel = lambda got: float((got - want).norm() / want.norm())  # noqa: E731
    assert rel(moe.experts(h, idx, w)) < 1e-5
    monkeypatch.setattr(grok.Grok1Experts, "act_fn", lambda self, x: F.silu(x))
    assert rel(moe.experts(h, idx, w)) > 0.05


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["fp8_per_tensor", "w4a8"])
def test_quantized_grok_cells_pass(quant):
    from harness.cell import CellSpec, run_cell

    r = run_cell(CellSpec(model="grok-2", tiny=True, quant=quant, device="cpu", graph="piecewise", max_tokens=32,
                          max_new_tokens=4))
    assert r.status == "pass", r.reason
