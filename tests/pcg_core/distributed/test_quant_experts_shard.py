"""Quantized MoE experts sharded for TP and EP, one process: each rank's shard (shard.py's _experts and
_experts_by_index, for a group of two) run as its rank runs it, the partial outputs summed as the all-reduce sums
them, against the unsharded experts — equal up to float32 summation order where activations round alike, and
equal to the unsharded experts rounding the down projection's input per K slice (emulate_expert_row_shards) where
they are quantized per token. Widths of 256 so that every shard holds whole 128×128 blocks and int4 groups."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GptOssConfig, Qwen3MoeConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

from pcg_core.distributed import shard
from pcg_core.distributed.group import ParallelGroup
from pcg_core.distributed.quant import activation_rounding_differs
from pcg_core.distributed.quant_experts import emulate_expert_row_shards
from pcg_core.errors import UnsupportedModel
from pcg_core.model.experts import pcg_experts_forward
from pcg_core.quant import get_scheme
from pcg_core.quant.layers.experts import intermediate_absmax, quantize_experts
from pcg_core.quant.layers.fp4_experts import quantize_experts_fp4
from pcg_core.quant.schemes.fp4 import Fp4Scheme

H, INTER, E, T = 256, 512, 4, 24  # INTER/2 = 256: whole 128-blocks and int4 groups of 128 in each shard
SCHEMES = ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8", "awq", "w4a8", "w4afp8", "nvfp4",
           "mxfp4"]  # gptq: act-order


def _experts(kind: str = "qwen3-moe", seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Experts whose rows and column blocks vary 10–100× with outliers, and 24 tokens routed to 2 of them each.
    gpt-oss: transposed [E, K, N], biased, gate and up rows interleaved."""
    if kind == "gpt-oss":
        mod = GptOssExperts(GptOssConfig(hidden_size=H, intermediate_size=INTER, num_local_experts=E))
    else:
        mod = Qwen3MoeExperts(Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=INTER, num_experts=E,
                                             num_experts_per_tok=2))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (mod.gate_up_proj, mod.down_proj):
            w = torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5
            w *= torch.logspace(-1, 1, p.shape[1])[torch.randperm(p.shape[1], generator=g)][None, :, None]
            w *= torch.logspace(-1, 1, p.shape[2] // 128).repeat_interleave(128)[None, None, :]
            w.view(-1)[torch.randint(0, w.numel(), (60,), generator=g)] *= 20
            p.copy_(w)
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            if hasattr(mod, name):
                getattr(mod, name).copy_(torch.randn(getattr(mod, name).shape, generator=g))
    x = torch.randn(T, H, generator=g) * torch.logspace(-1, 0.5, H)
    idx = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(T)])
    return mod, x, idx, torch.rand(T, 2, generator=g)


def _quantized(name: str, kind: str = "qwen3-moe"):
    mod, x, idx, w = _experts(kind)
    scheme = get_scheme(name)
    absmax = None
    if not getattr(scheme, "act_dynamic", True):
        absmax = {"gate_up": float(x.abs().max()), "down": intermediate_absmax(mod, x, idx)}
    if isinstance(scheme, Fp4Scheme):
        quantize_experts_fp4(mod, scheme)
    else:
        quantize_experts(mod, scheme, absmax)
    return mod, x, idx, w


def _run(mod, x, idx, w):
    return pcg_experts_forward(mod, x, idx, w)


def _rank(mod, rank: int, by_index: bool):
    m = copy.deepcopy(mod)
    g = ParallelGroup(rank, 2, "unused", "gloo")
    (shard._experts_by_index if by_index else shard._experts)(m, g, "probe")
    return m


def _by_index_forward(m, x, idx, w):
    """What ep_experts_class runs before its all-reduce: this rank's routes kept (made local), the others zeroed."""
    local = idx - m.ep_start
    mine = (local >= 0) & (local < m.num_experts)
    return pcg_experts_forward(m, x, torch.where(mine, local, torch.zeros_like(local)), w * mine)


def _assert_close(got, want, what):
    scale = want.abs().max()
    assert ((got - want).abs().max() / scale).item() < 1e-5, what


@pytest.mark.parametrize("kind", ["qwen3-moe", "gpt-oss"])
@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_intermediate_shards_sum_to_the_unsharded_experts(name, kind):
    mod, x, idx, w = _quantized(name, kind)
    ranks = [_rank(mod, r, by_index=False) for r in (0, 1)]
    assert type(ranks[0]).__name__.startswith("TensorParallel")
    got = _run(ranks[0], x, idx, w) + _run(ranks[1], x, idx, w)
    want_mod = copy.deepcopy(mod)
    if activation_rounding_differs(get_scheme(name)):
        emulate_expert_row_shards(want_mod, 2)
        plain = _run(mod, x, idx, w)
        assert (got - plain).abs().max() > 1e-4 * plain.abs().max(), "the shards' rounding is not visible: no test"
    _assert_close(got, _run(want_mod, x, idx, w), name)


@pytest.mark.parametrize("kind", ["qwen3-moe", "gpt-oss"])
@pytest.mark.parametrize("name", [*SCHEMES, "gptq"])
@torch.no_grad()
def test_whole_experts_per_rank_sum_to_the_unsharded_experts(name, kind):
    mod, x, idx, w = _quantized(name, kind)
    ranks = [_rank(mod, r, by_index=True) for r in (0, 1)]
    assert [r.num_experts for r in ranks] == [E // 2] * 2 and ranks[1].ep_start == E // 2
    got = _by_index_forward(ranks[0], x, idx, w) + _by_index_forward(ranks[1], x, idx, w)
    _assert_close(got, _run(mod, x, idx, w), name)


@pytest.mark.parametrize("name,buffer", [("fp8_block", "down_proj_scale"), ("fp8_per_token", "gate_up_proj_scale"),
                                         ("awq", "down_proj_scales"), ("w4a8", "gate_up_proj_scales"),
                                         ("nvfp4", "down_proj_scale")])
@torch.no_grad()
def test_a_rank_with_the_other_ranks_scales_fails_the_sum_check(name, buffer):
    """The planted fault a slicing bug makes: rank 1 holding rank 0's scales (or zeros) of one projection."""
    mod, x, idx, w = _quantized(name)
    a, b = (_rank(mod, r, by_index=False) for r in (0, 1))
    assert not torch.equal(getattr(a, buffer), getattr(b, buffer))
    b._buffers[buffer] = getattr(a, buffer).clone()
    want_mod = copy.deepcopy(mod)
    if activation_rounding_differs(get_scheme(name)):
        emulate_expert_row_shards(want_mod, 2)
    with pytest.raises(AssertionError):
        _assert_close(_run(a, x, idx, w) + _run(b, x, idx, w), _run(want_mod, x, idx, w), name)


def test_splits_that_would_cut_a_block_a_group_or_act_order_are_refused():
    """With the reason, never sliced approximately: MXFP4's 32-blocks of an intermediate size of 96 (48 a rank),
    128×128 blocks of one of 128 (64 a rank), and GPTQ's act-order (the down projection's K permuted across the
    shards)."""
    from pcg_core.quant import quantize_model

    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=128, num_experts=E, num_experts_per_tok=2)
    cfg48 = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=96, num_experts=E, num_experts_per_tok=2)
    mod = Qwen3MoeExperts(cfg48)
    quantize_model(torch.nn.ModuleDict({"experts": mod}), get_scheme("mxfp4"), skip=(), input_absmax={})
    with pytest.raises(UnsupportedModel, match="mxfp4's blocks of 32: a shard of 48"):
        shard._experts(mod, ParallelGroup(0, 2, "unused", "gloo"), "probe")
    for name, why in (("fp8_block", "128×128 blocks"), ("gptq", "act-order")):
        mod = Qwen3MoeExperts(cfg)
        quantize_model(torch.nn.ModuleDict({"experts": mod}), get_scheme(name), skip=(), input_absmax={})
        with pytest.raises(UnsupportedModel, match=why):
            shard._experts(mod, ParallelGroup(0, 2, "unused", "gloo"), "probe")
