"""Quantized linears sharded for TP, one process: each rank's shard (shard_quantized, for a group of two) run on its
input slice, the two partial outputs summed as the all-reduce sums them, against the unsharded layer — equal to it
where activations round alike (per-tensor static scales, FP8's 128-groups, 16-bit activations), and equal to the
unsharded layer rounding per K slice (emulate_row_shards) where they are quantized per token."""

from __future__ import annotations

import copy

import pytest
import torch

from pcg_core.distributed.group import ParallelGroup
from pcg_core.distributed.quant import _split_k_forward, activation_rounding_differs, shard_quantized
from pcg_core.errors import UnsupportedModel
from pcg_core.quant import get_scheme
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.layers.int4_linear import Int4Linear, W4A8Linear
from pcg_core.quant.layers.linear import QuantLinear

N, K = 256, 512  # K/2 = 256: whole 128-blocks and int4 groups of 128 in each shard


def _float_linear(seed: int, bias: bool) -> torch.nn.Linear:
    """Weights whose scales vary by row and by column block (10–100×) with outliers, as trained ones do."""
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    w = torch.randn(N, K, generator=g)
    w *= torch.logspace(-1, 1, N)[torch.randperm(N, generator=g)][:, None]
    w *= torch.logspace(-1, 1, K // 128).repeat_interleave(128)[None, :]
    w.view(-1)[torch.randint(0, N * K, (40,), generator=g)] *= 30
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=g))
    return lin


@torch.no_grad()
def _quantized(name: str, lin: torch.nn.Linear, x: torch.Tensor) -> torch.nn.Module:
    scheme = get_scheme(name)
    if isinstance(scheme, type(get_scheme("nvfp4"))):
        return Fp4Linear.from_scheme(lin, scheme)
    if isinstance(scheme, type(get_scheme("awq"))):
        return (W4A8Linear if scheme.w4a8 else Int4Linear).from_scheme(lin, scheme)
    return QuantLinear.from_linear(lin, scheme, None if scheme.act_dynamic else x.abs().max() / scheme.qmax)


def _shards(mod: torch.nn.Module, rowwise: bool) -> list[torch.nn.Module]:
    out = []
    for rank in (0, 1):
        m = copy.deepcopy(mod)
        shard_quantized(m, rowwise, ParallelGroup(rank, 2, "unused", "gloo"), "probe")
        out.append(m)
    return out


SCHEMES = ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8", "awq", "w4a8", "nvfp4", "mxfp4"]


def _assert_same_sum(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, lin: torch.nn.Linear) -> None:
    """Equal up to float32 summation order: two K halves summed apart differ from one whole-K sum by a few ulps of
    the sum of |x·w| (not of the output, which cancels to near 0 at some columns; how much depends on the CPU's
    GEMM blocking: 0.6–1 ulp here, an AMD host failed a fixed atol of 1e-4). A wrong slice or scale is ~1e-1 of it."""
    magnitude = x.abs() @ lin.weight.abs().T
    excess = (got - want).abs() - 16 * torch.finfo(torch.float32).eps * magnitude
    assert excess.max() <= 0, f"{(excess > 0).sum()} outputs differ beyond float32 summation order"


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("bias", [False, True])
@torch.no_grad()
def test_row_parallel_shards_sum_to_the_unsharded_layer(name, bias):
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(1)) * torch.logspace(-1, 1, K)
    lin = _float_linear(0, bias)
    full = _quantized(name, lin, x)
    a, b = _shards(full, rowwise=True)
    assert type(a).__name__.startswith("RowParallel") and a.in_features == K // 2
    got = a.local_forward(x[:, : K // 2]) + b.local_forward(x[:, K // 2 :])
    if a.tp_bias is not None:
        got = got + a.tp_bias
    if activation_rounding_differs(full.quant_scheme):
        want = _split_k_forward(full, x, parts=2)  # the unsharded weights, activations rounded per K half
        assert not torch.allclose(full(x), want, atol=1e-4)  # the rounding does differ from one whole-K rounding
    else:
        want = full(x)
    _assert_same_sum(got, want, x, lin)


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_column_parallel_shards_are_the_unsharded_layers_rows(name):
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(2))
    full = _quantized(name, _float_linear(3, True), x)
    a, b = _shards(full, rowwise=False)
    assert a.out_features == N // 2 and type(a) is type(full)
    torch.testing.assert_close(torch.cat([a(x), b(x)], -1), full(x), rtol=0, atol=0)


@pytest.mark.parametrize("name, scale", [("fp8_block", "weight_scale"), ("awq", "scales"), ("nvfp4", "weight_scale")])
@torch.no_grad()
def test_a_row_shard_with_the_other_ranks_scales_fails_the_sum_check(name, scale):
    """The row-parallel check's planted fault: rank 1 keeps rank 0's weight scales (block or group scales that vary
    by column block, as trained ones do)."""
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(1)) * torch.logspace(-1, 1, K)
    lin = _float_linear(0, False)
    full = _quantized(name, lin, x)
    a, b = _shards(full, rowwise=True)
    assert not torch.equal(getattr(a, scale), getattr(b, scale))  # the ranks' column blocks are scaled apart
    setattr(b, scale, getattr(a, scale).clone())
    got = a.local_forward(x[:, : K // 2]) + b.local_forward(x[:, K // 2 :])
    with pytest.raises(AssertionError, match="beyond float32 summation order"):
        _assert_same_sum(got, full(x), x, lin)


@torch.no_grad()
def test_a_wrong_scale_slice_is_visible():
    """The planted fault the checks above must see: rank 1 keeps rank 0's per-channel scales."""
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(2))
    full = _quantized("int8_w8a8", _float_linear(3, False), x)
    a, b = _shards(full, rowwise=False)
    b.weight_scale = a.weight_scale.clone()
    assert (torch.cat([a(x), b(x)], -1) - full(x)).abs().max() > 1e-2


@torch.no_grad()
def test_splits_that_would_cut_a_block_a_group_or_act_order_are_refused():
    lin = torch.nn.Linear(384, 256)  # K/2 = 192: not whole 128-blocks
    with pytest.raises(UnsupportedModel, match="128×128 blocks.*192 columns"):
        _shards(QuantLinear.from_linear(lin, get_scheme("fp8_block")), rowwise=True)
    with pytest.raises(UnsupportedModel, match="int4 groups of 128.*192 input features"):
        _shards(Int4Linear.from_scheme(lin, get_scheme("awq")), rowwise=True)
    with pytest.raises(UnsupportedModel, match="act-order"):
        _shards(Int4Linear.from_scheme(_float_linear(0, False), get_scheme("gptq")), rowwise=True)
    with pytest.raises(UnsupportedModel, match="mxfp4's blocks of 32.*48 input features"):
        _shards(Fp4Linear.from_scheme(torch.nn.Linear(96, 64), get_scheme("mxfp4")), rowwise=True)
