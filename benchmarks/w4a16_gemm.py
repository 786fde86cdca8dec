"""W4A16 (`pcg::w4a16_linear`, pcg_core/quant/kernels/w4a16_gemm.py) against bf16 F.linear on one N×K layer (default
8192×4096), side by side: every row a captured CUDA graph replayed, CUDA events around each replay after a
warm-up, the median of --repeat (≥ 50). Rows: bf16, awq-like (asym, g128), gptq-like (sym, g128) without and with
act-order Int4Linear, and an NVFP4 Fp4Linear (`pcg::fp4_linear`, kernels/fp4_gemm.py). Prints ms and the ratio to bf16 with the
targets (≤ 1.3× at M = 8, ≤ 1.25× at M = 4096; meets_target judges every quantized column); --out writes JSON. Reads no clocks and sets none: the GPU runs as it is configured.

    PYTHONPATH=. python benchmarks/w4a16_gemm.py [--n 8192 --k 4096 --tokens 8,64,512,4096 --out r.json]
    PYTHONPATH=. python benchmarks/w4a16_gemm.py --sweep            # tuning-table candidates at M ≤ 64
    PYTHONPATH=. python benchmarks/w4a16_gemm.py --scan-threshold   # fused GEMM vs dequant+cuBLAS by M

--sweep times each candidate GEMM configuration (and act-order gathered in the GEMM vs permuted first by our
kernel or index_select) at each small M and
prints the best: how configs/w4a16_gemm.json and PERM_IN_KERNEL_MAX_M are to be chosen; then the same for the NVFP4
kernel (configs/fp4_gemm.json). --scan-threshold times both paths at M = 16…256 (where they cross is
THRESHOLD_M) and act-order's activation permute — ours spread over K, ours walking rows, index_select — up to
M = 4096 (TRITON_PERMUTE_MAX_M, ROW_PERMUTE_MIN_M).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from pcg_core.quant import Fp4Linear, Int4Linear, get_scheme
from pcg_core.quant.kernels import fp4_gemm as fp4_w4a16
from pcg_core.quant.kernels import tuning
from pcg_core.quant.kernels import w4a16_gemm as w4a16
from quant_gemm import replay_ms, write_json  # benchmarks/, the script's own folder: replays timed, --out

TARGETS = {8: 1.3, 4096: 1.25}  # W4A16 time / bf16 time, at most
SWEEP_TOKENS = [1, 8, 16, 32, 64]
SWEEP_CANDIDATES = [  # (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages); BLOCK_M ≥ the M it is tried at
    (16, 32, 128, 1, 4, 4), (16, 32, 128, 2, 4, 4), (16, 64, 128, 1, 4, 4), (16, 64, 128, 2, 4, 4),
    (16, 64, 128, 4, 4, 4), (16, 64, 128, 8, 4, 4), (16, 128, 128, 2, 4, 4), (16, 128, 128, 4, 4, 4),
    (16, 64, 256, 2, 4, 3), (16, 64, 256, 4, 4, 3), (16, 32, 256, 4, 4, 3), (16, 64, 64, 4, 4, 5),
    (32, 64, 128, 1, 4, 4), (32, 64, 128, 2, 4, 4), (32, 128, 128, 2, 4, 4), (32, 32, 128, 2, 4, 4),
    (64, 64, 128, 1, 4, 4), (64, 64, 64, 1, 4, 4), (64, 128, 128, 1, 8, 3), (64, 128, 64, 1, 4, 4),
    (64, 32, 128, 1, 4, 4), (64, 64, 128, 2, 4, 4),
]
FP4_SWEEP_CANDIDATES = [  # BLOCK_K ≤ 64 keeps the decoded tile out of spills (kernels/fp4_gemm.py's note); 128 tried too
    (16, 64, 64, 4, 4, 4), (16, 64, 64, 8, 4, 4), (16, 64, 64, 2, 4, 4), (16, 32, 64, 4, 4, 4), (16, 128, 64, 4, 4, 4),
    (16, 64, 128, 4, 4, 3), (16, 64, 32, 8, 4, 5), (16, 128, 64, 2, 8, 4), (32, 64, 64, 2, 4, 4),
    (32, 64, 64, 4, 4, 4), (32, 32, 64, 2, 4, 4), (32, 128, 64, 2, 8, 4), (32, 64, 32, 4, 4, 5),
    (64, 64, 64, 1, 4, 4), (64, 64, 64, 2, 4, 4), (64, 32, 64, 2, 4, 4), (64, 64, 32, 2, 4, 5),
    (64, 128, 64, 1, 8, 3), (64, 64, 64, 1, 8, 4), (64, 128, 64, 2, 8, 3),
]
SCAN_TOKENS = [16, 32, 48, 64, 96, 128, 192, 256]
PERMUTE_TOKENS = [4096, 2048, 1024, 512, 128]  # the target's M first


def layers(n: int, k: int, fp4: bool = False) -> tuple[torch.nn.Linear, dict[str, Int4Linear | Fp4Linear]]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, device="cuda") * k**-0.5)
    out = {name: Int4Linear.from_scheme(lin, get_scheme(name)) for name in ("awq", "gptq")}
    if fp4:
        out = {"awq": out["awq"], "gptq_noact": Int4Linear.from_linear(lin, 128, sym=True), "gptq": out["gptq"]}
        out["fp4"] = Fp4Linear.from_linear(lin, 16)  # NVFP4: blocks of 16, e4m3 scales, a global
    return lin, out


def rel_err(layer: Int4Linear | Fp4Linear, x: torch.Tensor) -> float:
    if isinstance(layer, Fp4Linear):
        want = torch.nn.functional.linear(x.float(), layer.dequantized_weight())
    else:
        want = layer.weight_int4().reference_linear(x)
    return float((layer(x).float() - want).norm() / want.norm())


def compare(n: int, k: int, tokens: list[int], repeat: int) -> list[dict]:
    lin, int4 = layers(n, k, fp4=True)
    rows = []
    for m in tokens:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"m": m, "path": "gemm" if m <= w4a16.THRESHOLD_M else "dequant+cublas",
               "bf16_ms": replay_ms(lambda t: torch.nn.functional.linear(t, lin.weight), x, repeat)}
        for name, layer in int4.items():
            row[f"{name}_ms"] = replay_ms(layer, x, repeat)
            row[f"{name}_ratio"] = row[f"{name}_ms"] / row["bf16_ms"]
            row[f"{name}_rel_err"] = rel_err(layer, x)
        if m in TARGETS:
            row["target_ratio"] = TARGETS[m]
            row["meets_target"] = all(row[f"{s}_ratio"] <= TARGETS[m] for s in int4)
        rows.append(row)
        print(f"{m:>6} {row['path']:>15} {row['bf16_ms']:>8.4f} "
              + " ".join(f"{row[f'{s}_ms']:>8.4f} ({row[f'{s}_ratio']:.2f}×)" for s in int4)
              + (f"   target ≤ {TARGETS[m]}×: {'met' if row['meets_target'] else 'MISSED'}" if m in TARGETS else ""),
              flush=True)
    return rows


def sweep(n: int, k: int, repeat: int) -> dict:
    """Each candidate (and the table's own) at each small M on both layers; act-order both fused and not."""
    _, int4 = layers(n, k)
    best = {}
    for name, layer in int4.items():
        args = (layer.qweight, layer.scales, layer.zeros, layer.group, layer.perm, None)
        for m in SWEEP_TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            times = {}
            table = w4a16.gemm_config(m, k, layer.group)
            # act-order: gathered in the GEMM, or the activation permuted first by our kernel or by index_select
            modes = ("fused", "triton", "torch") if layer.perm is not None else ("-",)
            default = (table, "-" if layer.perm is None else "fused" if m <= w4a16.PERM_IN_KERNEL_MAX_M
                       else "triton" if m <= w4a16.TRITON_PERMUTE_MAX_M else "torch")
            for cfg in dict.fromkeys([table, *(c for c in SWEEP_CANDIDATES if c[0] >= m)]):
                for mode in modes:
                    def fn(t, a=args, c=cfg, p=m if mode == "fused" else 0, tp=0 if mode == "torch" else 1 << 30):
                        return w4a16.triton_linear(t, *a, threshold=1 << 30, config=c, perm_in_kernel=p,
                                                   triton_permute=tp)
                    try:
                        times[(cfg, mode)] = replay_ms(fn, x, repeat)
                    except Exception as e:  # noqa: BLE001 - a candidate that does not compile is skipped
                        print(f"  {name} M={m} {cfg}: {type(e).__name__}: {str(e)[:120]}")
            (cfg, mode), ms = min(times.items(), key=lambda kv: kv[1])
            best[f"{name}/{m}"] = {"config": cfg, "act_order": mode, "ms": ms,
                                   "table_config": table, "table_ms": times.get(default),
                                   "all": {f"{c} {md}": t for (c, md), t in sorted(times.items(), key=lambda kv: kv[1])}}
            per_mode = {md: min(t for (c, mm), t in times.items() if mm == md) for md in modes}
            print(f"{name} M={m:>3}: best {cfg} act-order={mode} {ms:.4f} ms (table {table}: "
                  f"{best[f'{name}/{m}']['table_ms']}; best per act-order mode {per_mode})", flush=True)
    return best


def sweep_fp4(n: int, k: int, repeat: int) -> dict:
    """The NVFP4 kernel's candidates at each small M (no act-order)."""
    _, layer = layers(n, k, fp4=True)
    layer = layer["fp4"]
    args = (layer.weight_packed, layer.weight_scale, layer.global_scale, layer.block, None)
    best = {}
    for m in SWEEP_TOKENS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        table = fp4_w4a16.gemm_config(m, k, layer.block)
        times = {}
        for cfg in dict.fromkeys([table, *(c for c in FP4_SWEEP_CANDIDATES if c[0] >= m)]):
            if fp4_w4a16.gemm_config(m, k, layer.block, cfg) is None:
                continue
            try:
                times[cfg] = replay_ms(lambda t, c=cfg: fp4_w4a16.triton_linear(t, *args, threshold=1 << 30, config=c),
                                       x, repeat)
            except Exception as e:  # noqa: BLE001 - a candidate that does not compile is skipped
                print(f"  fp4 M={m} {cfg}: {type(e).__name__}: {str(e)[:120]}")
        cfg, ms = min(times.items(), key=lambda kv: kv[1])
        best[f"fp4/{m}"] = {"config": cfg, "ms": ms, "table_config": table, "table_ms": times.get(table),
                            "all": {str(c): t for c, t in sorted(times.items(), key=lambda kv: kv[1])}}
        print(f"fp4 M={m:>3}: best {cfg} {ms:.4f} ms (table {table}: {times.get(table)})", flush=True)
    return best


def scan_threshold(n: int, k: int, repeat: int) -> list[dict]:
    _, int4 = layers(n, k)
    rows = []
    for m in SCAN_TOKENS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"m": m}
        for name, layer in int4.items():
            args = (layer.qweight, layer.scales, layer.zeros, layer.group, layer.perm, None)
            for path, threshold in (("gemm", 1 << 30), ("dequant", 0)):
                row[f"{name}_{path}_ms"] = replay_ms(
                    lambda t, a=args, th=threshold: w4a16.triton_linear(t, *a, threshold=th), x, repeat)
        rows.append(row)
        print(f"M={m:>4} " + " ".join(f"{s}: gemm {row[f'{s}_gemm_ms']:.4f} dequant {row[f'{s}_dequant_ms']:.4f}"
                                      for s in int4), flush=True)
    return rows


def scan_permute(n: int, k: int, repeat: int) -> list[dict]:
    """Act-order on the dequantize path, the whole linear timed per way of permuting the activation — ours spread
    over K, index_select, or ours a whole row per program (tl.gather) — beside bf16 at the same M: how
    TRITON_PERMUTE_MAX_M and ROW_PERMUTE_MIN_M are chosen."""
    t0 = time.perf_counter()
    bf16, int4 = layers(n, k)
    print(f"layers built in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    layer = int4["gptq"]  # act-order on the dequantize path: the activation permuted by our kernel or index_select
    args = (layer.qweight, layer.scales, layer.zeros, layer.group, layer.perm, None)
    # the activation permuted by index_select, ours spread over K, ours a whole row per program (tl.gather)
    variants = {"x_permuted_torch": {"triton_permute": 0, "rows_permute": 1 << 62},
                "x_permuted_triton": {"triton_permute": 1 << 30, "rows_permute": 1 << 62},
                "x_permuted_rows": {"triton_permute": 0, "rows_permute": 1}}
    for m in PERMUTE_TOKENS:  # printed as measured: a scan cut by a timeout keeps what it timed
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = x.index_select(1, layer.perm)
        row = {"m": m, "bf16_ms": replay_ms(lambda t: bf16(t), x, repeat)}
        print(f"M={m:>4} bf16 {row['bf16_ms']:.4f}", flush=True)
        for v, kw in variants.items():  # each variant checked first: a wrong one must not be timed
            t0 = time.perf_counter()
            got = w4a16.permute_activation(x, layer.perm, kw["triton_permute"], kw["rows_permute"])
            assert torch.equal(got, want), f"{v} M={m}: not x[:, perm]"
            row[f"gptq_dequant_{v}_ms"] = replay_ms(
                lambda t, kw=kw: w4a16.triton_linear(t, *args, threshold=0, **kw), x, repeat)
            print(f"M={m:>4} gptq act-order dequant, {v}: {row[f'gptq_dequant_{v}_ms']:.4f} ms "
                  f"({row[f'gptq_dequant_{v}_ms'] / row['bf16_ms']:.3f}× bf16; {time.perf_counter() - t0:.1f} s with "
                  "the compile)", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--tokens", default="8,64,512,4096")
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--sweep", action="store_true", help="time tuning-table candidates at M ≤ 64")
    ap.add_argument("--scan-threshold", action="store_true", help="fused GEMM vs dequant+cuBLAS at M = 16…256")
    ap.add_argument("--scan-permute", action="store_true", help="act-order's activation permute, by gather, at large M")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    a = ap.parse_args()
    if not w4a16.available():
        raise SystemExit("needs CUDA and Triton")
    a.repeat = max(a.repeat, 50)
    import triton

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "n": a.n, "k": a.k, "repeat": a.repeat,
              "threshold_m": w4a16.THRESHOLD_M, "perm_in_kernel_max_m": w4a16.PERM_IN_KERNEL_MAX_M,
              "gemm_configs": tuning.configs(w4a16.KERNEL), "dequant_config": w4a16.DEQUANT_CONFIG,
              "triton_permute_max_m": w4a16.TRITON_PERMUTE_MAX_M,
              "row_permute_min_m": w4a16.ROW_PERMUTE_MIN_M, "fp4_gemm_configs": tuning.configs(fp4_w4a16.KERNEL),
              "fp4_threshold_m": fp4_w4a16.THRESHOLD_M}
    if a.sweep:
        result["sweep"] = sweep(a.n, a.k, a.repeat)
        result["sweep_fp4"] = sweep_fp4(a.n, a.k, a.repeat)
    if a.scan_threshold:
        result["scan_threshold"] = scan_threshold(a.n, a.k, a.repeat)
    if a.scan_threshold or a.scan_permute:
        result["scan_permute"] = scan_permute(a.n, a.k, a.repeat)
    if not (a.sweep or a.scan_threshold or a.scan_permute):
        print(f"{a.n}×{a.k}, CUDA-graph replay, median of {a.repeat} (ms; ratio to bf16)")
        print(f"{'M':>6} {'path':>15} {'bf16':>8} {'awq g128 asym':>17} {'gptq g128':>17} {'gptq g128 act':>17}"
              f" {'nvfp4':>17}")
        result["rows"] = compare(a.n, a.k, [int(t) for t in a.tokens.split(",")], a.repeat)
    write_json(a.out, result)


if __name__ == "__main__":
    main()
