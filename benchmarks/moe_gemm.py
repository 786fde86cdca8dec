"""The quantized experts' first grouped GEMM (gate_up) three ways, side by side on the GPU: bf16 `torch._grouped_mm`
over float weights (the unquantized floor), experts.py's dequantize-every-expert + `torch._grouped_mm` (what the
cells ran so far), and moe_gemm's kernel over the codes as held. Each a captured CUDA graph replayed, CUDA events
around each replay after a warm-up, the median of --repeat. Shapes: Qwen3-30B-A3B (128 experts, 1536×2048) and
DeepSeek-V3 (256 experts, 4096×7168), top-8 routing of 8…4096 tokens. First checks that the kernel's output is
the dequantizing path's within bf16 rounding (a wrong kernel must not be timed). --sweep times moe_gemm's
candidate configurations per row count instead (how configs/moe_gemm.json is to be chosen). Reads no clocks, sets none.

    PYTHONPATH=. python benchmarks/moe_gemm.py [--shapes qwen3-30b,deepseek-v3] [--tokens 8,64,512,4096] [--out r.json]
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

from pcg_core.quant.layers import experts
from pcg_core.quant.kernels import moe_gemm, tuning
from pcg_core.quant.schemes.e2m1 import e2m1_table
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES
from pcg_core.quant.schemes.int4 import INT4_SCHEMES
from pcg_core.quant.schemes.w8a8 import get_scheme
from quant_gemm import replay_ms, write_json  # benchmarks/, the script's own folder

DEVICE = "cuda"  # the script runs on the GPU; a CPU dry run (TRITON_INTERPRET=1) sets it
SHAPES = {"qwen3-30b": (128, 1536, 2048), "deepseek-v3": (256, 4096, 7168)}  # (E, N = 2·moe_intermediate, K = hidden)
TOP_K = 8
FORMATS = ["gptq", "fp8_per_token", "fp8_block", "int8_w8a8", "awq", "nvfp4", "mxfp4"]  # timed (act-order first)
ALL_FORMATS = ["fp8_per_tensor", *FORMATS]  # stand_in builds each (the GPU test checks every one)
SWEEP = [(16, 64, 128, 4, 3), (16, 128, 128, 4, 3), (32, 64, 128, 4, 3), (32, 128, 64, 4, 3), (64, 64, 128, 4, 3),
         (64, 128, 64, 8, 3), (64, 128, 128, 8, 3), (128, 128, 64, 8, 3), (64, 256, 64, 8, 3)]


def stand_in(name: str, e: int, n: int, k: int) -> torch.nn.Module:
    """A module holding one projection (`gate_up_proj`) of `e` experts quantized by scheme `name` with random codes,
    under the buffer names experts.py reads."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    mod = torch.nn.Module()
    scheme = get_scheme(name)
    mod.quant_scheme = scheme
    if name in FP4_SCHEMES:
        block = scheme.block
        mod.register_buffer("gate_up_proj", torch.randint(0, 256, (e, n, k // 2), generator=g, device=DEVICE,
                                                          dtype=torch.uint8))
        mod.register_buffer("gate_up_proj_scale", torch.rand(e, n, k // block, generator=g, device=DEVICE) * 0.01)
        glob = torch.rand(e, n, generator=g, device=DEVICE) + 0.5 if name == "nvfp4" else None  # NVFP4's row globals
        mod.register_buffer("gate_up_proj_global", glob)
        mod.register_buffer("fp4_e2m1", e2m1_table(torch.device(DEVICE)), persistent=False)
        mod.fp4_block = block
        return mod
    if name in INT4_SCHEMES:
        group = 128
        codes = torch.randint(-2**31, 2**31 - 1, (e, n, k // 8), generator=g, device=DEVICE, dtype=torch.int32)
        mod.register_buffer("gate_up_proj", codes)
        mod.register_buffer("gate_up_proj_scales", torch.rand(e, n, k // group, generator=g, device=DEVICE) * 0.01)
        mod.register_buffer("gate_up_proj_zeros", torch.full((e, n, k // group), 8.0, device=DEVICE))
        perm = torch.stack([torch.randperm(k, generator=g, device=DEVICE) for _ in range(e)]) if scheme.act_order else None
        mod.register_buffer("gate_up_proj_perm", perm)
        mod.gate_up_proj_group = group
        return mod
    w = torch.randn(e, n, k, generator=g, device=DEVICE, dtype=torch.bfloat16)
    codes = (w * 64).to(scheme.qdtype) if scheme.kind == "fp8" else (w * 32).round().clamp(-127, 127).to(torch.int8)
    shape = {"tensor": (e,), "channel": (e, n, 1), "block": (e, -(-n // 128), -(-k // 128))}[scheme.weights]
    mod.register_buffer("gate_up_proj", codes)
    mod.register_buffer("gate_up_proj_scale", torch.rand(*shape, generator=g, device=DEVICE) * 0.01)
    return mod


def routed(tokens: int, e: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows [tokens·TOP_K, K] sorted by expert, counts [E] int32, offsets [E] int32) of a random top-8 routing."""
    g = torch.Generator(device=DEVICE).manual_seed(1)
    ids = torch.rand(tokens, e, generator=g, device=DEVICE).topk(TOP_K, dim=1).indices.reshape(-1)
    ids = torch.sort(ids).values
    counts = torch.bincount(ids, minlength=e).int()
    rows = torch.randn(ids.numel(), k, generator=g, device=DEVICE, dtype=torch.bfloat16)
    return rows, counts, torch.cumsum(counts, 0, dtype=torch.int32)


def measure(shape: str, tokens: list[int], repeat: int) -> list[dict]:
    e, n, k = SHAPES[shape]
    floats = torch.randn(e, n, k, device=DEVICE, dtype=torch.bfloat16) * k**-0.5
    out = []
    for name in FORMATS:
        mod = stand_in(name, e, n, k)
        w = experts.expert_weights(mod, "gate_up_proj")
        for t in tokens:
            rows, counts, offsets = routed(t, e, k)
            fused = moe_gemm.grouped_linear(rows, counts, w)
            dequant = torch._grouped_mm(rows, experts.dequantized_experts_weight(mod, "gate_up_proj", rows.dtype).transpose(1, 2),
                                        offs=offsets)
            err = float((fused.float() - dequant.float()).norm() / dequant.float().norm())
            assert err < 1e-2, f"{shape} {name} T={t}: the kernel is {err:.3g} from the dequantizing path"
            row = {"shape": shape, "format": name, "tokens": t, "rel_err": err,
                   "bf16_ms": replay_ms(lambda r: torch._grouped_mm(r, floats.transpose(1, 2), offs=offsets), rows, repeat),
                   "dequant_ms": replay_ms(lambda r: torch._grouped_mm(
                       r, experts.dequantized_experts_weight(mod, "gate_up_proj", r.dtype).transpose(1, 2), offs=offsets), rows, repeat),
                   "fused_ms": replay_ms(lambda r: moe_gemm.grouped_linear(r, counts, w), rows, repeat)}
            gather = ""
            if w.perm is not None:  # act-order the other way: gathered inside the GEMM (moe_gemm.PERMUTE_ROWS_MIN)
                row["gather_ms"] = replay_ms(lambda r: moe_gemm.grouped_linear(r, counts, w, permute_rows_min=1 << 62),
                                             rows, repeat)
                gather = f"  (gathered in the GEMM {row['gather_ms']:8.4f}, {row['gather_ms'] / row['bf16_ms']:5.2f}×)"
            out.append(row)
            print(f"{shape:>12} {name:>14} T={t:>5}: bf16 {row['bf16_ms']:8.4f}  dequant+grouped {row['dequant_ms']:8.4f} "
                  f"({row['dequant_ms'] / row['bf16_ms']:5.2f}×)  fused {row['fused_ms']:8.4f} "
                  f"({row['fused_ms'] / row['bf16_ms']:5.2f}×)  err {err:.1e}{gather}", flush=True)
    return out


def sweep(shape: str, tokens: list[int], repeat: int) -> list[dict]:
    e, n, k = SHAPES[shape]
    out = []
    for name in ("fp8_block", "awq"):
        mod = stand_in(name, e, n, k)
        w = experts.expert_weights(mod, "gate_up_proj")
        for t in tokens:
            rows, counts, _ = routed(t, e, k)
            want = moe_gemm.grouped_linear(rows, counts, w, config=tuning.configs(moe_gemm.KERNEL)[-1][1])
            times = {}
            for cfg in SWEEP:
                got = moe_gemm.grouped_linear(rows, counts, w, config=cfg)
                if got is None or not torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2):
                    continue  # a configuration that declines or disagrees is not timed
                times[cfg] = replay_ms(lambda r, c=cfg: moe_gemm.grouped_linear(r, counts, w, config=c), rows, repeat)
            best = min(times, key=times.get)
            out.append({"shape": shape, "format": name, "tokens": t, "best": best,
                        "times": {str(c): v for c, v in times.items()}})
            print(f"{shape:>12} {name:>10} T={t:>5}: best {best} {times[best]:.4f} ms; "
                  + " ".join(f"{c}:{v:.4f}" for c, v in sorted(times.items(), key=lambda kv: kv[1])[:4]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-30b,deepseek-v3")
    ap.add_argument("--tokens", default="8,64,512,4096")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    import triton

    tokens = [int(t) for t in a.tokens.split(",")]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "configs": tuning.configs(moe_gemm.KERNEL), "top_k": TOP_K, "formats": FORMATS}
    for shape in a.shapes.split(","):
        key = "sweep" if a.sweep else "rows"
        result.setdefault(key, []).extend(sweep(shape, tokens, a.repeat) if a.sweep else measure(shape, tokens, a.repeat))
    write_json(a.out, result)


if __name__ == "__main__":
    main()
