"""The grouped GEMM over quantized experts (pcg_core/quant/kernels/moe_gemm.py): its block table covers every sorted row once
with its own expert, for any routing; the kernel (under Triton's interpreter on CPU, float32 so the comparison is
tight) equals each row through its expert's dequantized weight for every weight format, ragged blocks and
experts with no rows included; planted faults (rows given to the neighbouring expert, the next expert's scales,
act-order's permutation ignored, a block's scale read from the wrong column block) fail. The compiled kernel
against experts.py's dequantize-then-grouped_mm path, and replayed in a CUDA graph, is in test_quant_gpu.py."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import interpreted, rel, run_interpreted_tests

from pcg_core.quant.kernels import moe_gemm, tuning
from pcg_core.quant.schemes.e2m1 import e2m1_table, unpack_e2m1
from pcg_core.quant.schemes.int4 import pack_nibbles
from pcg_core.quant.kernels.moe_gemm import ExpertWeights, block_table, grouped_linear
from pcg_core.quant.schemes.w8a8 import BLOCK, FP8

E, N, K = 5, 96, 256  # N not a multiple of the 64-wide tiles: the edge is masked
COUNTS = [7, 0, 20, 1, 12]  # an expert without rows, one with a single row, blocks cut short


@pytest.mark.parametrize("block_m", [1, 4, 16, 64])
@pytest.mark.parametrize("seed", range(4))
def test_block_table_covers_every_row_once_with_its_expert(block_m, seed):
    g = torch.Generator().manual_seed(seed)
    experts = int(torch.randint(1, 12, (1,), generator=g))
    rows = int(torch.randint(0, 60, (1,), generator=g))
    ids = torch.sort(torch.randint(0, experts, (rows,), generator=g)).values
    counts = torch.bincount(ids, minlength=experts).to(torch.int32)
    expert, first, end = block_table(counts, rows, block_m)
    assert expert.numel() == -(-rows // block_m) + min(experts, rows)  # the static bound, whatever the routing
    owner = torch.full((rows,), -1)
    for e, f, t in zip(expert.tolist(), first.tolist(), end.tolist()):
        if f >= t:
            continue
        assert t - f >= 1 and min(t, f + block_m) - f <= block_m
        block = torch.arange(f, min(t, f + block_m))
        assert (owner[block] == -1).all(), "a row in two blocks"
        owner[block] = e
    assert torch.equal(owner, ids), "every row once, in a block of its own expert"


def _routing(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor(COUNTS, dtype=torch.int32)
    x = torch.randn(int(counts.sum()), K, generator=g)
    return x, counts, torch.repeat_interleave(torch.arange(E), counts.long())


def _reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each row through its own expert's (dequantized, canonical-order) weight, one at a time in float64."""
    return torch.stack([x[i].double() @ weights[ids[i]].double().T for i in range(x.shape[0])]).float()


def _eightbit(kind: str, scale_kind: str, g: torch.Generator) -> tuple[ExpertWeights, torch.Tensor]:
    w = torch.randn(E, N, K, generator=g)
    qmax = 448.0 if kind == "fp8" else 127.0
    if scale_kind == "tensor":
        scale = w.abs().amax(dim=(1, 2)) / qmax
        full = scale.view(E, 1, 1).expand(E, N, K)
    elif scale_kind == "channel":
        scale = w.abs().amax(dim=2, keepdim=True) / qmax
        full = scale.expand(E, N, K)
    else:
        nb, kb = -(-N // BLOCK), K // BLOCK
        padded = torch.nn.functional.pad(w, (0, 0, 0, nb * BLOCK - N))
        scale = padded.view(E, nb, BLOCK, kb, BLOCK).abs().amax(dim=(2, 4)) / qmax
        full = scale.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)[:, :N, :K]
    codes = (w / full).to(FP8) if kind == "fp8" else (w / full).round().clamp(-127, 127).to(torch.int8)
    return ExpertWeights("8bit", codes, scale, scale_kind), codes.float() * full


def _int4(act_order: bool, g: torch.Generator, group: int = 64) -> tuple[ExpertWeights, torch.Tensor]:
    q = torch.randint(0, 16, (E, N, K), generator=g, dtype=torch.uint8)
    scales = torch.rand(E, N, K // group, generator=g) * 0.1 + 0.01
    zeros = torch.randint(0, 16, (E, N, K // group), generator=g).float()
    stored = (q.float() - zeros.repeat_interleave(group, 2)) * scales.repeat_interleave(group, 2)
    perm = torch.stack([torch.randperm(K, generator=g) for _ in range(E)]) if act_order else None
    weights = stored
    if perm is not None:  # column j of the stored weight is input channel perm[e, j]
        weights = torch.empty_like(stored).scatter_(2, perm[:, None, :].expand(E, N, K), stored)
    codes = torch.stack([pack_nibbles(q[e], 1) for e in range(E)])
    return ExpertWeights("int4", codes, scales, "none", zeros, group, perm), weights


def _fp4(block: int, with_global: bool, g: torch.Generator) -> tuple[ExpertWeights, torch.Tensor]:
    """Random E2M1 bytes (two codes each, low nibble first, as pack_e2m1 writes them: every code, negative zero
    included), positive block scales and NVFP4's row globals; the dense weight decoded by the module's own reader
    (unpack_e2m1, the value table), which the kernel's arithmetic decoding must equal."""
    packed = torch.randint(0, 256, (E, N, K // 2), generator=g, dtype=torch.uint8)
    scales = torch.rand(E, N, K // block, generator=g) + 0.25
    glob = torch.rand(E, N, generator=g) + 0.5 if with_global else None
    table = e2m1_table(torch.device("cpu"))
    dense = table[unpack_e2m1(packed).long()] * scales.repeat_interleave(block, 2)
    if glob is not None:
        dense = dense * glob[..., None]
    return ExpertWeights("fp4", packed, scales, group=block, global_rows=glob), dense


def _cases() -> dict[str, tuple[ExpertWeights, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(E, N, K, generator=g)
    cases = {"float": (ExpertWeights("float", w), w)}
    for kind in ("fp8", "int8"):
        for scale_kind in ("tensor", "channel", "block"):
            cases[f"{kind}_{scale_kind}"] = _eightbit(kind, scale_kind, g)
    cases["int4"] = _int4(False, g)
    cases["int4_act_order"] = _int4(True, g)
    cases["nvfp4"] = _fp4(16, True, g)
    cases["mxfp4"] = _fp4(32, False, g)
    return cases


CONFIGS = [(16, 64, 64, 4, 1), (32, 64, 128, 4, 1), (16, 32, 32, 4, 1), (16, 32, 16, 4, 1)]  # K tiles 16…128


@interpreted
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", list(_cases()))
def test_interpreted_kernel_is_each_rows_expert(case, config):
    x, counts, ids = _routing()
    w, dense = _cases()[case]
    got = grouped_linear(x, counts, w, config=config)
    assert got is not None and got.shape == (x.shape[0], N)
    assert rel(got, _reference(x, ids, dense)) < 1e-5, case


@interpreted
@pytest.mark.parametrize("config", CONFIGS[:2])
@pytest.mark.parametrize("permute_rows_min", [1, 1 << 30])
def test_interpreted_act_order_either_way(config, permute_rows_min):
    """Act-order met by permuting each row by its expert's permutation first (PERMUTE_ROWS_MIN) or by the gather
    inside the GEMM: each row's expert's answer both ways."""
    x, counts, ids = _routing()
    w, dense = _cases()["int4_act_order"]
    got = grouped_linear(x, counts, w, config=config, permute_rows_min=permute_rows_min)
    assert rel(got, _reference(x, ids, dense)) < 1e-5


@interpreted
@pytest.mark.parametrize("k", [256, 2500])  # one column block, several with the last cut short
def test_interpreted_rows_permuted_by_their_experts_permutation(k):
    g = torch.Generator().manual_seed(k)
    counts = torch.tensor(COUNTS, dtype=torch.int32)
    x = torch.randn(int(counts.sum()), k, generator=g).half()
    perm = torch.stack([torch.randperm(k, generator=g) for _ in range(E)])
    ids = torch.repeat_interleave(torch.arange(E), counts.long())
    want = torch.stack([x[i, perm[ids[i]]] for i in range(x.shape[0])])
    assert torch.equal(moe_gemm.permute_expert_rows(x, counts, perm), want)
    assert not torch.equal(moe_gemm.permute_expert_rows(x, counts, perm.roll(1, 0)), want)  # another expert's
    assert moe_gemm.permute_expert_rows(x[:0], torch.zeros(E, dtype=torch.int32), perm).shape == (0, k)


@interpreted
def test_interpreted_no_rows_and_layouts_it_declines():
    x, counts, _ = _routing()
    w, _ = _cases()["float"]
    assert grouped_linear(x[:0], torch.zeros(E, dtype=torch.int32), w, config=CONFIGS[0]).shape == (0, N)
    sharded = _cases()["int4_act_order"][0]
    sharded = ExpertWeights("int4", sharded.codes, sharded.scale, "none", sharded.zeros, sharded.group,
                            sharded.perm[:, None, :].expand(E, 2, K))
    assert grouped_linear(x, counts, sharded, config=CONFIGS[0]) is None  # act-order per row shard: the caller's path
    assert grouped_linear(x[:, :200], counts, ExpertWeights("float", torch.randn(E, N, 200)), config=CONFIGS[0]) is None


@interpreted
@pytest.mark.parametrize("fault", ["rows to the next expert", "next expert's scales", "act-order ignored",
                                   "act-order by the next expert's permutation",
                                   "block scale of the wrong column block", "FP4 nibbles swapped", "FP4 global dropped"])
def test_interpreted_planted_faults_fail(fault):
    x, counts, ids = _routing()
    cases = _cases()
    if fault == "rows to the next expert":
        w, dense = cases["int8_channel"]
        got = grouped_linear(x, counts.roll(1), w, config=CONFIGS[0])
    elif fault == "next expert's scales":
        w, dense = cases["fp8_channel"]
        got = grouped_linear(x, counts, ExpertWeights("8bit", w.codes, w.scale.roll(1, 0), "channel"), config=CONFIGS[0])
    elif fault == "act-order ignored":
        w, dense = cases["int4_act_order"]
        got = grouped_linear(x, counts, ExpertWeights("int4", w.codes, w.scale, "none", w.zeros, w.group), config=CONFIGS[0])
    elif fault == "act-order by the next expert's permutation":  # the rows permuted first, each by a wrong one
        w, dense = cases["int4_act_order"]
        got = grouped_linear(x, counts, w._replace(perm=w.perm.roll(1, 0)), config=CONFIGS[0], permute_rows_min=1)
    elif fault == "block scale of the wrong column block":
        w, dense = cases["fp8_block"]
        got = grouped_linear(x, counts, ExpertWeights("8bit", w.codes, w.scale.flip(2), "block"), config=CONFIGS[0])
    elif fault == "FP4 nibbles swapped":
        w, dense = cases["mxfp4"]
        swapped = (w.codes << 4) | (w.codes >> 4)
        got = grouped_linear(x, counts, ExpertWeights("fp4", swapped, w.scale, group=w.group), config=CONFIGS[0])
    else:
        w, dense = cases["nvfp4"]
        got = grouped_linear(x, counts, ExpertWeights("fp4", w.codes, w.scale, group=w.group), config=CONFIGS[0])
    assert rel(got, _reference(x, ids, dense)) > 0.05, fault


def test_configs_cover_every_row_count():
    assert moe_gemm.config_for(1, 128) == tuning.configs(moe_gemm.KERNEL)[0][1]
    assert moe_gemm.config_for(1 << 40, 1) == tuning.configs(moe_gemm.KERNEL)[-1][1]


def test_the_kernel_under_the_interpreter():
    """The interpreter tests above, in a child pytest with TRITON_INTERPRET=1."""
    run_interpreted_tests(__file__)


@interpreted
@pytest.mark.parametrize("name", ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8", "awq", "gptq", "w4a8",
                                  "nvfp4"])
def test_interpreted_grouped_forward_by_the_kernel_equals_the_reference(name, monkeypatch):
    """The experts' grouped forward (experts.py; FP4: layers/fp4_experts.py) with its GEMMs by this kernel (ENABLED)
    against the dense reference on a tiny Qwen3-MoE layer, float32; the kernel must have run (not the dequantizing
    fallback), and rows given to other experts must show."""
    from pcg_helpers import routed_experts

    from pcg_core.quant.layers import experts
    from pcg_core.quant.layers.fp4_experts import quantize_experts_fp4
    from pcg_core.quant.schemes.w8a8 import get_scheme

    mod, x, idx, w = routed_experts("qwen3-moe")
    scheme = get_scheme(name)
    if name == "nvfp4":
        quantize_experts_fp4(mod, scheme)
    else:
        experts.quantize_experts(mod, scheme, input_absmax={"gate_up": 4.0, "down": 4.0})
    want = experts.quantized_experts_forward(mod, x, idx, w)
    monkeypatch.setattr(moe_gemm, "ENABLED", True)
    calls = []
    real = moe_gemm.grouped_linear
    monkeypatch.setattr(moe_gemm, "grouped_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = experts.grouped_quantized_experts_forward(mod, x, idx, w)
    assert len(calls) == 2 and rel(got, want) < 1e-5, (name, rel(got, want))
    # as a piecewise capture traces it: dynamo, the whole forward one graph, the token count dynamic — the op opaque
    torch._dynamo.reset()
    traced = torch.compile(experts.grouped_quantized_experts_forward, backend="eager", fullgraph=True, dynamic=False)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(idx, 0)
    torch._dynamo.mark_dynamic(w, 0)
    assert torch.equal(traced(mod, x, idx, w), got)
    fewer = experts.grouped_quantized_experts_forward(mod, x[:9], idx[:9], w[:9])
    assert torch.equal(traced(mod, x[:9], idx[:9], w[:9]), fewer)
    monkeypatch.setattr(moe_gemm, "grouped_linear", lambda rows, counts, wt, **k: real(rows, counts.roll(1), wt, **k))
    assert rel(experts.grouped_quantized_experts_forward(mod, x, idx, w), want) > 0.05
