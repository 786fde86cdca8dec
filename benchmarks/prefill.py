"""Prefill latency of eager, full, piecewise and breakable, side by side in one run, on one model.

    python benchmarks/prefill.py --model harness/models/configs/Qwen__Qwen3-0.6B.json --dtype bfloat16

Prints per token count the median latency (CUDA events, after warm-up) of each backend, the speedups, the
capture seconds for the whole ladder and the graph pool bytes, and whether each replay is bitwise equal to an
eager forward at the same padded token count. --json writes everything to a file.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from harness.cell.timing import median_ms
from pcg_core import CaptureConfig, Engine, EngineConfig, load_model

BACKENDS = ("disabled", "full", "piecewise", "breakable")


def environment() -> dict:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        try:
            import subprocess

            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            env["driver"] = "unknown"
        env["cuda"] = torch.version.cuda
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="config.json, model directory or hub id")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", default="8,32,128,512,2048,4096")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)

    tokens = [int(t) for t in args.tokens.split(",")]
    backends = args.backends.split(",")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    device = torch.device(args.device)
    lm = load_model(args.model, layers=args.layers, tiny=args.tiny, weights="synthetic", dtype=dtype, device=device, seed=0)
    vocab = lm.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = {n: torch.randint(0, vocab, (n,), generator=gen).tolist() for n in tokens}
    kv_slots = max(max(tokens), args.max_tokens) + 64

    result = {"model": args.model, "layers": lm.config.num_hidden_layers, "dtype": args.dtype, "env": environment(), "backends": {}}
    reference: dict[int, torch.Tensor] = {}
    for name in backends:
        t0 = time.perf_counter()
        engine = Engine(lm.model, EngineConfig(device=args.device, dtype=args.dtype, kv_slots=kv_slots,
                                               capture=CaptureConfig(backend=name, max_tokens=args.max_tokens)))
        build_s = time.perf_counter() - t0
        st = engine.stats
        row = {"build_s": build_s, "trace_s": st.trace_s, "compile_s": st.compile_s, "capture_s": st.capture_s,
               "graph_pool_bytes": st.graph_pool_bytes, "graphs_captured": st.graphs_captured, "pieces": st.pieces,
               "buckets": len(st.buckets), "latency_ms": {}, "bitwise_equal_eager": {}, "max_abs_diff": {}}
        for n in tokens:
            batch = engine.prefill_batch([prompts[n]])
            row["latency_ms"][n] = median_ms(lambda: engine.forward(batch), device, warmup=3, repeat=args.repeat)
            out = engine.forward(batch).clone()
            if name == "disabled":
                reference[n] = out
            else:
                eager_same_pad = engine.forward(batch, eager=True)
                row["bitwise_equal_eager"][n] = bool(torch.equal(out, eager_same_pad))
                row["max_abs_diff"][n] = float((out.float() - eager_same_pad.float()).abs().max())
        result["backends"][name] = row
        print(f"{name:10s} built in {build_s:6.2f}s (trace {st.trace_s:.2f}s, capture {st.capture_s:.2f}s, "
              f"pool {st.graph_pool_bytes / 2**20:.0f} MiB, graphs {st.graphs_captured})", flush=True)
        del engine
        torch.cuda.empty_cache() if device.type == "cuda" else None

    # Table
    names = [b for b in BACKENDS if b in result["backends"]]
    print(f"\nmodel {args.model} layers={result['layers']} {args.dtype} on {result['env'].get('gpu', 'cpu')}")
    head = "tokens | " + " | ".join(f"{n} ms" for n in names)
    if "full" in names:
        head += " | " + " | ".join(f"{n}/full" for n in names if n not in ("full", "disabled"))
    if "disabled" in names:
        head += " | " + " | ".join(f"eager/{n}" for n in names if n != "disabled")
    print(head)
    for n in tokens:
        lat = {b: result["backends"][b]["latency_ms"][n] for b in names}
        cells = [f"{lat[b]:.2f}" for b in names]
        if "full" in names:
            cells += [f"{lat[b] / lat['full']:.2f}" for b in names if b not in ("full", "disabled")]
        if "disabled" in names:
            cells += [f"{lat['disabled'] / lat[b]:.2f}x" for b in names if b != "disabled"]
        print(f"{n:6d} | " + " | ".join(cells))
    for b in names:
        if b != "disabled":
            r = result["backends"][b]
            eq = all(r["bitwise_equal_eager"].values())
            print(f"{b}: capture {r['capture_s']:.2f}s (+trace {r['trace_s']:.2f}s) for {r['buckets']} buckets, "
                  f"pool {r['graph_pool_bytes'] / 2**20:.0f} MiB, bitwise equal to eager at same padding: {eq} "
                  f"(max abs diff {max(r['max_abs_diff'].values()):.3g})")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
