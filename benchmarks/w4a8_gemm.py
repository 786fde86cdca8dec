"""W4A8 (`pcg::w4a8_linear`, pcg_core/quant/kernels/w4a8_gemm.py) against bf16 F.linear on one N×K layer (default 8192×4096):
int4 weights (symmetric, g128) × int8 activations (w4a8) and × FP8 e4m3 ones (w4afp8), each row a captured CUDA
graph replayed (benchmarks/quant_gemm.py's replay_ms: CUDA events around each replay after a warm-up, the median
of --repeat ≥ 50). Prints ms, the ratio to bf16 and the target (≤ 1.1× at M = 4096), and the share of the
activation-quant kernel; --out writes JSON. Reads no clocks and sets none: the GPU runs as it is configured.

    PYTHONPATH=. python benchmarks/w4a8_gemm.py [--n 8192 --k 4096 --tokens 8,64,512,4096 --out r.json]
    PYTHONPATH=. python benchmarks/w4a8_gemm.py --sweep            # tuning-table candidates at each M, both activations
    PYTHONPATH=. python benchmarks/w4a8_gemm.py --sweep-large      # large-M configurations, cuBLASLt's FP8
    PYTHONPATH=. python benchmarks/w4a8_gemm.py --scan-threshold   # codes converted in registers vs 8-bit scratch

--sweep times each candidate GEMM configuration on the quantized activation (the quant kernel is the same for
every candidate) and prints the best per M: how configs/w4a8_gemm.json is to be chosen. Above THRESHOLD_M the sweep
times the GEMM on the 8-bit scratch (the path those M take). --scan-threshold times both paths at M = 32…1024:
where they cross is THRESHOLD_M.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

from pcg_core.quant.kernels import fp8_gemm
from pcg_core.quant.kernels import tuning
from pcg_core.quant.kernels import w4a8_gemm as w4a8
from pcg_core.quant.layers.int4_linear import W4A8Linear
from pcg_core.quant.schemes.int4 import INT4_SCHEMES
from quant_gemm import replay_ms, write_json  # benchmarks/, the script's own folder: replays timed, --out

TARGETS = {4096: 1.1}  # W4A8 time / bf16 time, at most
SCHEMES = ("w4a8", "w4afp8")
SWEEP_CANDIDATES = [  # (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages)
    (16, 64, 128, 4, 4, 4), (16, 64, 128, 8, 4, 4), (16, 128, 128, 4, 4, 4), (16, 64, 64, 4, 4, 5),
    (32, 64, 128, 2, 4, 4), (32, 128, 128, 2, 4, 4), (32, 64, 128, 4, 4, 4),
    (64, 64, 128, 1, 4, 4), (64, 64, 128, 2, 4, 4), (64, 128, 128, 1, 4, 4), (64, 128, 128, 1, 8, 3),
    (128, 128, 128, 1, 8, 3), (128, 128, 128, 1, 8, 4), (128, 128, 64, 1, 8, 4), (128, 64, 128, 1, 4, 4),
    (64, 256, 128, 1, 8, 3), (256, 128, 128, 1, 8, 3), (128, 256, 128, 1, 8, 3), (128, 256, 64, 1, 8, 3),
]
SWEEP_TOKENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
SCAN_TOKENS = [32, 64, 96, 128, 192, 256, 512, 1024]
LARGE_TOKENS = [4096]
LARGE_CANDIDATES = [
    (64, 128, 128, 1, 4, 4), (64, 128, 128, 1, 8, 3), (128, 128, 128, 1, 8, 3), (128, 128, 128, 1, 8, 4),
    (128, 128, 64, 1, 8, 4), (128, 256, 128, 1, 8, 3), (256, 128, 128, 1, 8, 3), (128, 256, 64, 1, 8, 4),
]


def layers(n: int, k: int) -> tuple[torch.nn.Linear, dict[str, W4A8Linear]]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, device="cuda") * k**-0.5)
    return lin, {name: W4A8Linear.from_scheme(lin, INT4_SCHEMES[name]) for name in SCHEMES}


def rel_err(layer: W4A8Linear, x: torch.Tensor) -> float:
    want = w4a8.reference(x, layer.qweight, layer.scales, layer.zeros, layer.group, layer.act).float()
    return float((layer(x).float() - want).norm() / want.norm())


def _quant_only(layer: W4A8Linear, m: int, k: int):
    xq = torch.empty(m, k, device="cuda", dtype=w4a8.QDTYPE[layer.act])
    sx = torch.empty(m, device="cuda")
    return lambda t: w4a8.launch_act_quant(t, layer.act, xq, sx)


def compare(n: int, k: int, tokens: list[int], repeat: int) -> list[dict]:
    lin, quant = layers(n, k)
    rows = []
    for m in tokens:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"m": m, "config": w4a8.gemm_config(m, k, 128),
               "bf16_ms": replay_ms(lambda t: torch.nn.functional.linear(t, lin.weight), x, repeat)}
        for name, layer in quant.items():
            row[f"{name}_ms"] = replay_ms(layer, x, repeat)
            row[f"{name}_ratio"] = row[f"{name}_ms"] / row["bf16_ms"]
            row[f"{name}_quant_ms"] = replay_ms(_quant_only(layer, m, k), x, repeat)
            row[f"{name}_rel_err"] = rel_err(layer, x)
            if w4a8.scaled_mm_fits(x, layer.act, layer.group, n, k) and m > w4a8.SCALED_MM_MIN_M:  # the Triton GEMM beside it
                args = (layer.qweight, layer.scales, layer.zeros, layer.group, layer.act)
                row[f"{name}_triton_ms"] = replay_ms(lambda t, a=args: w4a8.triton_linear(t, *a, scaled_mm=False), x, repeat)
        if m in TARGETS:
            row["target_ratio"] = TARGETS[m]
            row["meets_target"] = all(row[f"{s}_ratio"] <= TARGETS[m] for s in quant)
        rows.append(row)
        print(f"{m:>6} {row['bf16_ms']:>8.4f} "
              + " ".join(f"{row[f'{s}_ms']:>8.4f} ({row[f'{s}_ratio']:.2f}×, quant {row[f'{s}_quant_ms']:.4f})"
                         for s in quant)
              + "".join(f" [{s} Triton {row[f'{s}_triton_ms']:.4f}]" for s in quant if f"{s}_triton_ms" in row)
              + (f"   target ≤ {TARGETS[m]}×: {'met' if row['meets_target'] else 'MISSED'}" if m in TARGETS else ""),
              flush=True)
    return rows


def sweep(n: int, k: int, repeat: int, tokens: list[int], candidates: list[tuple[int, ...]]) -> dict:
    """Each candidate (and the table's own) at each M, the GEMM alone on a quantized activation — on the 8-bit
    scratch above THRESHOLD_M, where FP8 also times cuBLASLt's block-scaled GEMM (block_scaled_mm) beside them."""
    _, quant = layers(n, k)
    best = {}
    for name, layer in quant.items():
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq, sx = w4a8.quantize_act(x, layer.act)
            sx = sx[:, 0].contiguous()
            weight = layer.qweight
            scratch = m > w4a8.THRESHOLD_M[layer.act]
            if scratch:
                weight = torch.empty(n, k, device="cuda", dtype=xq.dtype)
                w4a8.launch_to_8bit(layer.qweight, layer.zeros, layer.group, weight)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            table = w4a8.gemm_config(m, k, layer.group)
            times = {}
            for cfg in dict.fromkeys([table, *candidates]):
                fitted = w4a8.gemm_config(m, k, layer.group, cfg)
                try:
                    times[cfg] = replay_ms(lambda t, c=fitted: w4a8.launch_gemm(
                        t, sx, weight, layer.scales, layer.zeros, layer.group, None, out, c), xq, repeat)
                except Exception as e:  # noqa: BLE001 - a candidate that does not compile is skipped
                    print(f"  {name} M={m} {cfg}: {type(e).__name__}: {str(e)[:120]}")
            if scratch and w4a8.scaled_mm_fits(x, layer.act, layer.group, n, k):
                try:
                    times["scaled_mm"] = replay_ms(lambda t: fp8_gemm.block_scaled_mm(
                        t, sx, weight, layer.scales, None, torch.bfloat16), xq, repeat)
                except Exception as e:  # noqa: BLE001 - cuBLASLt without 1×128 × 1×128 block scaling: reported
                    print(f"  {name} M={m} scaled_mm: {type(e).__name__}: {str(e)[:200]}")
            cfg, ms = min(times.items(), key=lambda kv: kv[1])
            best[f"{name}/{m}"] = {"config": cfg, "ms": ms, "table_config": table, "table_ms": times.get(table),
                                   "all": {str(c): t for c, t in sorted(times.items(), key=lambda kv: kv[1])}}
            print(f"{name} M={m:>5}: best {cfg} {ms:.4f} ms (table {table}: {times.get(table)})", flush=True)
    return best


def scan_threshold(n: int, k: int, repeat: int, tokens: list[int]) -> list[dict]:
    """Both paths of each layer by M: codes converted in the GEMM's registers vs into an 8-bit scratch first."""
    _, quant = layers(n, k)
    rows = []
    for m in tokens:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"m": m}
        for name, layer in quant.items():
            args = (layer.qweight, layer.scales, layer.zeros, layer.group, layer.act)
            paths = [("fused", 1 << 62, False), ("convert", 0, False)]
            if w4a8.scaled_mm_fits(x, layer.act, layer.group, n, k):
                paths.append(("scaled_mm", 0, True))
            for path, threshold, smm in paths:
                row[f"{name}_{path}_ms"] = replay_ms(
                    lambda t, a=args, th=threshold, sm=smm: w4a8.triton_linear(t, *a, threshold=th, scaled_mm=sm), x, repeat)
        rows.append(row)
        print(f"M={m:>5} " + " ".join(f"{s}: " + " ".join(f"{p} {row[f'{s}_{p}_ms']:.4f}" for p in ("fused", "convert", "scaled_mm")
                                                          if f"{s}_{p}_ms" in row) for s in quant), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--tokens", default="8,64,512,4096")
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--sweep", action="store_true", help="time tuning-table candidates at each M")
    ap.add_argument("--sweep-large", action="store_true",
                    help="the large-M GEMM's candidates, and cuBLASLt's block-scaled FP8")
    ap.add_argument("--scan-threshold", action="store_true", help="in-register conversion vs 8-bit scratch by M")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    a = ap.parse_args()
    if not w4a8.available():
        raise SystemExit("needs CUDA and Triton")
    a.repeat = max(a.repeat, 50)
    import triton

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "n": a.n, "k": a.k, "repeat": a.repeat,
              "gemm_configs": tuning.configs(w4a8.KERNEL), "quant_block": w4a8.QUANT_BLOCK, "threshold_m": w4a8.THRESHOLD_M,
              "scaled_mm_min_m": w4a8.SCALED_MM_MIN_M, "convert_config": w4a8.CONVERT_CONFIG}
    if a.sweep:
        result["sweep"] = sweep(a.n, a.k, a.repeat, SWEEP_TOKENS, SWEEP_CANDIDATES)
    if a.sweep_large:
        result["sweep_large"] = sweep(a.n, a.k, a.repeat, LARGE_TOKENS, LARGE_CANDIDATES)
    if a.scan_threshold:
        result["scan_threshold"] = scan_threshold(a.n, a.k, a.repeat, SCAN_TOKENS)
    if not (a.sweep or a.sweep_large or a.scan_threshold):
        print(f"{a.n}×{a.k}, CUDA-graph replay, median of {a.repeat} (ms; ratio to bf16; the activation-quant kernel alone)")
        print(f"{'M':>6} {'bf16':>8} {'w4a8 (int8 acts)':>40} {'w4afp8 (fp8 acts)':>40}")
        result["rows"] = compare(a.n, a.k, [int(t) for t in a.tokens.split(",")], a.repeat)
    write_json(a.out, result)


if __name__ == "__main__":
    main()
