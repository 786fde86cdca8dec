"""The FP8 block GEMMs against their reference math over K-block counts 1…20 (issue 47): the 128×128-block linear
(`QuantLinear`, fp8_block) as it ran before (`torch._scaled_mm`, the weight-block scales a plain transpose, stride
K/128) and as it runs now (`scaled_mm` with the documented layout, `block_weight_scales`: K/128 padded to 4), and W4AFP8's 1×128 × 1×128 block-scaled GEMM
(`fp8_gemm.block_scaled_mm`). Weights from `structured_weight` where present (block scales that vary 10–100×), else
`randn · k^-0.5`. Relative (Frobenius) error per K; CUDA only.

    python benchmarks/fp8_block_layout.py
"""

from __future__ import annotations

import torch

from pcg_core.quant import QuantLinear
from pcg_core.quant.layers import linear as quant_linear
from pcg_core.quant.schemes.w8a8 import get_scheme, reference_linear

try:
    from pcg_core.quant.synthetic_weights import structured_weight
except ImportError:  # before the realistic weights land
    structured_weight = None


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    if structured_weight is not None:
        return structured_weight(n, k, generator=g, device="cuda")
    return torch.randn(n, k, generator=g, device="cuda") * k**-0.5


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def main() -> None:
    new_layout = quant_linear.block_fp8_mm
    from planted_fp8_block_layout import old_block_fp8_mm as old_layout  # (importing it plants it: undone here)

    quant_linear.block_fp8_mm = new_layout
    print(f"weights: {'structured_weight' if structured_weight else 'randn'}; N = 896 (7 blocks) and 1024 (8)")
    print(f"{'K':>5} {'K/128':>5} {'M':>5} {'N':>5} {'old layout':>11} {'new layout':>11}")
    worst_new = 0.0
    for kb in range(1, 21):
        k = 128 * kb
        for n in (896, 1024):
            lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                lin.weight.copy_(_weight(n, k, kb))
            layer = QuantLinear.from_linear(lin, get_scheme("fp8_block"))
            for m in (8, 129):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                want = reference_linear(x, layer.weight, layer.weight_scale, layer.scheme)
                rels = []
                for layout in (old_layout, new_layout):
                    quant_linear.block_fp8_mm = layout
                    try:
                        rels.append(_rel(layer(x), want))
                    except RuntimeError:  # a torch that checks the old operand's stride refuses it
                        rels.append(float("nan"))
                    finally:
                        quant_linear.block_fp8_mm = new_layout
                worst_new = max(worst_new, rels[1])
                print(f"{k:>5} {kb:>5} {m:>5} {n:>5} {rels[0]:>11.3g} {rels[1]:>11.3g}")
    print(f"worst new-layout relative error: {worst_new:.3g}")
    from pcg_core.quant.kernels import fp8_gemm
    print("W4AFP8 block_scaled_mm (1×128 × 1×128): K, K/128, relative error against the float32 product")
    for kb in range(1, 21):
        k, n, m = 128 * kb, 1024, 130
        g = torch.Generator(device="cuda").manual_seed(kb)
        xq = (torch.randn(m, k, generator=g, device="cuda") * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
        w8 = (torch.randn(n, k, generator=g, device="cuda") * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
        sx = torch.rand(m, generator=g, device="cuda") + 0.1
        scales = torch.rand(n, kb, generator=g, device="cuda") * 10 + 0.1
        got = fp8_gemm.block_scaled_mm(xq, sx, w8, scales, None, torch.bfloat16)
        ws = scales.repeat_interleave(128, 1)
        want = (xq.float() * sx[:, None]) @ (w8.float() * ws).t()
        print(f"{k:>5} {kb:>5} {_rel(got, want):>11.3g}")


if __name__ == "__main__":
    main()
