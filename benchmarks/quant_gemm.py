"""Each 8-bit scheme's linear against bf16 F.linear, side by side in one run: CUDA-graph replay, median of CUDA
events, at M = 8/64/512/4096 tokens on one N×K layer (default 8192×4096). The activation quantization is
inside every quantized row, eager (torch ops) and, with --compile, compiled by inductor (how a piecewise piece
runs it: fused). Prints a table of ms and the ratio to bf16; --json writes the numbers.

    PYTHONPATH=. python benchmarks/quant_gemm.py [--n 8192 --k 4096 --tokens 8,64,512,4096 --compile] [--sweep-int8]

--sweep-int8 times every candidate configuration of our INT8 kernel (pcg_core/quant/kernels/int8_gemm.py) at each M
and prints the best: how its configuration table was chosen.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from pcg_core.quant import SCHEMES, QuantLinear
from pcg_core.quant.kernels import int8_gemm as int8_mm
from pcg_core.quant.schemes.w8a8 import quantize_activation

# Candidate INT8 configurations for --sweep-int8: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages).
INT8_CANDIDATES = [
    (16, 64, 256, 1, 4, 4), (16, 128, 128, 1, 4, 4), (16, 64, 128, 1, 4, 5), (32, 64, 256, 1, 4, 4),
    (64, 64, 256, 1, 4, 4), (64, 128, 128, 1, 4, 4), (32, 128, 128, 1, 4, 4), (64, 64, 128, 1, 4, 5),
    (128, 128, 128, 8, 8, 3), (128, 64, 128, 8, 4, 4), (64, 128, 128, 8, 4, 4), (128, 128, 64, 8, 4, 4),
    (128, 256, 128, 8, 8, 3), (128, 128, 128, 8, 8, 4), (256, 128, 128, 8, 8, 3), (128, 256, 64, 8, 8, 4),
]


def write_json(path: Path | None, result: dict) -> None:
    """The benchmark's result as JSON at path (folders made), when one is given: what --out does in each script."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {path}")


def replay_ms(fn, x: torch.Tensor, repeat: int = 50) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    for _ in range(5):
        g.replay()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def sweep_int8(layer: QuantLinear, tokens: list[int], k: int) -> None:
    for m in tokens:
        xq, sx = quantize_activation(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), layer.scheme)
        out = torch.empty(m, layer.out_features, device="cuda", dtype=torch.bfloat16)
        times = {}
        for cfg in INT8_CANDIDATES:
            try:
                times[cfg] = replay_ms(lambda a, cfg=cfg: int8_mm.launch(a, layer.weight, sx, layer.weight_scale, None, out, cfg), xq)
            except Exception as e:  # noqa: BLE001 - a configuration the GPU cannot hold (shared memory) is skipped
                print(f"int8 {cfg} M={m}: {type(e).__name__}: {str(e)[:120]}")
        best = sorted(times.items(), key=lambda kv: kv[1])[:4]
        print(f"int8 sweep M={m}: table {int8_mm.config_for(m)} {times.get(int8_mm.config_for(m), float('nan')):.4f} ms; best "
              + ", ".join(f"{c} {t:.4f}" for c, t in best), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--tokens", default="8,64,512,4096")
    ap.add_argument("--compile", action="store_true", help="also inductor-compiled rows (fused activation quantization)")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--sweep-int8", action="store_true", help="time each INT8 kernel configuration, print the best")
    args = ap.parse_args(argv)
    torch._dynamo.config.recompile_limit = 64  # every layer shares QuantLinear.forward's code: one entry per (scheme, M)
    tokens = [int(t) for t in args.tokens.split(",")]
    lin = torch.nn.Linear(args.k, args.n, bias=False, device="cuda", dtype=torch.bfloat16)
    rows: dict[str, dict[int, float]] = {"bf16": {}}
    layers = {}
    for name, s in SCHEMES.items():
        layers[name] = QuantLinear.from_linear(lin, s, None if s.act_dynamic else torch.tensor(4.0 / s.qmax, device="cuda"))
    fns = {"bf16": lin, **layers}
    if args.compile:
        fns.update({f"{n}+inductor": torch.compile(layer, dynamic=False) for n, layer in layers.items()})
    for m in tokens:
        x = torch.randn(m, args.k, device="cuda", dtype=torch.bfloat16)
        for label, fn in fns.items():
            try:
                rows.setdefault(label, {})[m] = replay_ms(fn, x)
            except Exception as e:  # noqa: BLE001 - a row that cannot run is printed as such
                rows.setdefault(label, {})[m] = float("nan")
                print(f"{label} M={m}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; N={args.n} K={args.k}; ms (ratio to bf16)")
    print("scheme | " + " | ".join(f"M={m}" for m in tokens))
    for label, r in rows.items():
        print(f"{label} | " + " | ".join(f"{r[m]:.4f}" + ("" if label == "bf16" else f" ({r[m] / rows['bf16'][m]:.2f}×)")
                                        for m in tokens))
    if args.sweep_int8:
        sweep_int8(layers["int8_w8a8"], tokens, args.k)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"n": args.n, "k": args.k, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
