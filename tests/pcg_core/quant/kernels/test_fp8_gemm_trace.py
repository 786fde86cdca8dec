"""The block FP8 GEMM is one opaque node to Dynamo: piecewise capture traces the model with Dynamo, and torch 2.11's
`scaled_mm` lands on a builtin Dynamo cannot trace (`_scaled_mm_v2`), which failed every fp8_block cell under
piecewise on the H200 (2026-12-05). Traced here on CPU with the op's fake (the kernel itself never runs)."""

from __future__ import annotations

import torch

from pcg_core.quant.kernels import fp8_gemm


def test_block_fp8_mm_traces_as_one_custom_op_node_under_dynamo_fullgraph():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: (torch.zeros(8, 256, dtype=torch.bfloat16),)  # the CUDA kernel is not run on CPU

    def f(xq, sx, w, ws):
        return fp8_gemm.block_fp8_mm(xq, sx, w, ws)

    fp8 = torch.float8_e4m3fn
    xq, w = torch.zeros(8, 896).to(fp8), torch.zeros(256, 896).to(fp8)
    torch._dynamo.reset()
    out = torch.compile(f, backend=backend, fullgraph=True)(xq, torch.ones(8, 7), w, torch.ones(2, 7))
    assert out.shape == (8, 256)
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.pcg.block_fp8_mm.default], targets


def test_block_fp8_mm_fake_gives_the_kernels_shape_and_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fp8 = torch.float8_e4m3fn
        out = torch.ops.pcg.block_fp8_mm(torch.empty(12, 384, dtype=fp8), torch.empty(12, 3),
                                          torch.empty(640, 384, dtype=fp8), torch.empty(5, 3))
    assert out.shape == (12, 640) and out.dtype == torch.bfloat16
