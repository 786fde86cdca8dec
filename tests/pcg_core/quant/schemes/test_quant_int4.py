"""pcg_core/quant/schemes/int4.py: AWQ and GPTQ packings against hand-packed known answers, round trips into the canonical
layout, act-order, and the planted faults a wrong port makes (nibble order, AWQ interleave, GPTQ's z − 1, g_idx
ignored), each of which must move the dequantized weight."""

from __future__ import annotations

import pytest
import torch

from pcg_core.errors import ConfigError
from pcg_core.quant.layers.int4_linear import Int4Linear
from pcg_core.quant.schemes.int4 import (AWQ_ORDER, PLAIN_ORDER, Int4Weight, awq_pack, awq_unpack, gptq_pack,
                                         gptq_unpack, pack_nibbles, quantize_int4, unpack_nibbles)


def _weight(n=16, k=64, seed=0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


def test_known_answers_of_the_nibble_orders():
    codes = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.uint8)
    # plain (GPTQ): element i in bits 4i..4i+3, so the word reads 0x87654321
    assert pack_nibbles(codes, 1).item() == 0x87654321 - 2**32
    # AWQ: nibble i holds element AWQ_ORDER[i] = 0, 2, 4, 6, 1, 3, 5, 7 → nibbles 1,3,5,7,2,4,6,8 from the bottom
    assert pack_nibbles(codes, 1, AWQ_ORDER).item() == 0x86427531 - 2**32
    assert unpack_nibbles(torch.tensor([[0x86427531 - 2**32]], dtype=torch.int32), 1, AWQ_ORDER).tolist() == codes.tolist()
    # a word with the top bit clear stays positive; codes outside 0..15 are refused
    assert pack_nibbles(torch.tensor([[15, 0, 0, 0, 0, 0, 0, 7]]), 1).item() == 0x7000000F
    with pytest.raises(ValueError, match="0..15"):
        pack_nibbles(torch.tensor([[16, 0, 0, 0, 0, 0, 0, 0]]), 1)


def test_gptq_v1_stores_zero_minus_one():
    w = quantize_int4(_weight(), 32, sym=True)  # symmetric: every zero is 8
    v1, v2 = gptq_pack(w), gptq_pack(w, v2=True)
    assert unpack_nibbles(v1["qzeros"], 1).unique().tolist() == [7]  # 8 − 1, as GPTQ v1 checkpoints hold it
    assert unpack_nibbles(v2["qzeros"], 1).unique().tolist() == [8]
    assert gptq_unpack(v1["qweight"], v1["qzeros"], v1["scales"], v1["g_idx"], 32).zeros.unique().tolist() == [8.0]
    assert v1["qweight"].shape == (64 // 8, 16) and v1["qzeros"].shape == (2, 2) and v1["g_idx"].tolist() == [k // 32 for k in range(64)]


@pytest.mark.parametrize("group", [32, 64, -1])
@pytest.mark.parametrize("sym", [True, False])
def test_round_trips_keep_the_dequantized_weight_exactly(group, sym):
    w = _weight()
    q = quantize_int4(w, group, sym)
    ref = q.dequantize()
    assert (ref - w).abs().max() <= q.scales.max() * 0.5 + 1e-6  # round to nearest: within half a step
    fp16 = lambda t: t.to(torch.float16).float()  # noqa: E731 - the checkpoints keep fp16 scales
    want = (q.q.float() - q.zeros.repeat_interleave(q.group, 1)) * fp16(q.scales).repeat_interleave(q.group, 1)
    a = awq_pack(q)
    assert a["qweight"].shape == (64, 16 // 8) and a["scales"].shape == (64 // q.group, 16)
    assert torch.equal(awq_unpack(a["qweight"], a["qzeros"], a["scales"], group).dequantize(), want)
    for v2 in (False, True):
        g = gptq_pack(q, v2=v2)
        assert torch.equal(gptq_unpack(g["qweight"], g["qzeros"], g["scales"], g["g_idx"], group, v2=v2).dequantize(), want)


def test_act_order_is_a_permutation_of_k_applied_to_the_activation():
    w = _weight(k=128)
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(1))
    q = quantize_int4(w[:, perm], 32, sym=False)  # GPTQ with desc_act: groups formed in the act order
    q.perm, q.scales = perm, q.scales.half().float()  # the checkpoint's fp16 scales: the round trip is then exact
    g = gptq_pack(q)
    assert not torch.equal(g["g_idx"].long(), torch.arange(128) // 32)  # not monotonic: act-order on disk
    back = gptq_unpack(g["qweight"], g["qzeros"], g["scales"], g["g_idx"], 32)
    assert back.perm is not None and torch.equal(back.original(), q.original())
    assert (back.original() - w).abs().max() < 0.5 * q.scales.max() + 1e-6  # the matrix in the checkpoint's K order
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(back.reference_linear(x), x @ back.original().t(), rtol=1e-5, atol=1e-5)


def test_bad_shapes_and_group_indices_are_named():
    q = quantize_int4(_weight(), 32, sym=True)
    g = gptq_pack(q)
    with pytest.raises(ConfigError, match="group_size 48 does not divide"):
        gptq_unpack(g["qweight"], g["qzeros"], g["scales"], g["g_idx"], 48)
    with pytest.raises(ConfigError, match="do not fit"):
        awq_unpack(awq_pack(q)["qweight"], awq_pack(q)["qzeros"], awq_pack(q)["scales"], 16)
    lopsided = g["g_idx"].clone()
    lopsided[:40] = 0
    with pytest.raises(ConfigError, match="act-order needs 32 in each"):
        gptq_unpack(g["qweight"], g["qzeros"], g["scales"], lopsided, 32)


@pytest.mark.parametrize("fault", ["nibble order reversed", "AWQ read in plain order", "GPTQ zero not +1",
                                   "g_idx ignored"])
def test_planted_format_faults_move_the_weight(fault):
    w = _weight(k=128)
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(3))
    q = quantize_int4(w[:, perm], 32, sym=False)
    q.perm = perm
    want = q.original()
    if fault == "nibble order reversed":
        g = gptq_pack(q)
        qw = pack_nibbles(unpack_nibbles(g["qweight"], 0, PLAIN_ORDER[::-1]), 0)
        got = gptq_unpack(qw, g["qzeros"], g["scales"], g["g_idx"], 32).original()
    elif fault == "AWQ read in plain order":
        plain = quantize_int4(w, 32, sym=False)
        a = awq_pack(plain)
        want = plain.original()
        got = Int4Weight(unpack_nibbles(a["qweight"], 1).t(), plain.scales, unpack_nibbles(a["qzeros"], 1).t().float(), 32).original()
    elif fault == "GPTQ zero not +1":
        g = gptq_pack(q)
        got = gptq_unpack(g["qweight"], g["qzeros"], g["scales"], g["g_idx"], 32, v2=True).original()
    else:
        g = gptq_pack(q)
        got = gptq_unpack(g["qweight"], g["qzeros"], g["scales"], None, 32).original()
    assert (got - want).abs().max() > q.scales.min(), fault  # off by at least a quantization step somewhere


def test_the_module_computes_the_dequantized_reference():
    lin = torch.nn.Linear(64, 24, bias=True)
    mod = Int4Linear.from_linear(lin, 32, sym=False)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(4))
    w = quantize_int4(lin.weight.detach(), 32, sym=False)
    assert torch.equal(mod(x), torch.nn.functional.linear(x, w.dequantize(), lin.bias))
    assert mod.qweight.shape == (24, 8) and mod.qweight.dtype == torch.int32 and "act_order=False" in repr(mod)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(5))
    wp = quantize_int4(lin.weight.detach()[:, perm], 32, sym=True)
    wp.perm = perm
    ordered = Int4Linear.from_weight(wp, dtype=torch.float32)
    torch.testing.assert_close(ordered(x), x @ wp.original().t(), rtol=1e-5, atol=1e-5)


def test_a_model_with_int4_linears_runs_the_dequantized_model():
    """Every linear of a small Llama swapped for Int4Linear: the logits are those of the same model with each
    weight replaced by its dequantized matrix."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    plain = copy.deepcopy(model)
    for name, mod in list(model.named_modules()):
        if type(mod) is torch.nn.Linear and not name.endswith("lm_head"):
            q = Int4Linear.from_linear(mod, 32, sym=False)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, q)
            plain.get_submodule(name).weight.data = q.weight_int4().dequantize()
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got, want = model(ids).logits, plain(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert sum(isinstance(m, Int4Linear) for m in model.modules()) == 2 * 7
