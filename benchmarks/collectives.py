"""Tensor parallelism's collectives as split ops (piecewise, breakable: pcg::all_reduce_ runs between their graphs)
against inside one graph (full), side by side in one run, with the model sharded over the ranks.

    torchrun --nproc_per_node 2 benchmarks/collectives.py --model harness/models/configs/Qwen__Qwen3-0.6B.json
    python benchmarks/collectives.py --model ...    # a world of one: the host cost of the collectives alone

Per token count, the median prefill latency (CUDA events after warm-up, the same number of forwards on every rank so
the collectives pair up; rank 0's numbers, the slowest rank's beside them) of each capture backend; on a world of one
also the same weights unsharded under full (no collective at all), the floor. Every replay is checked bitwise
against eager at the same padding. Ratios to full with the collectives captured; rank 0 prints the table last and
--json writes everything.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill import environment  # noqa: E402 - the one environment record of the benchmarks

from harness.cell.timing import median_ms  # noqa: E402
from pcg_core import CaptureConfig, Engine, EngineConfig, load_model  # noqa: E402
from pcg_core.distributed import ParallelGroup, init_from_env, register_group, shard_model, shutdown  # noqa: E402

BACKENDS = ("piecewise", "breakable", "full")
FLOOR = "full, unsharded"


def world(device: str) -> ParallelGroup:
    """The ranks torchrun started, or a world of one (its collectives real NCCL or gloo calls over one rank)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        group = init_from_env(device)
        assert group is not None
        return group
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:  # a free one: two benchmarks (or test workers) side by side must not meet
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1)
    return register_group(dist.group.WORLD)


def measure(engine: Engine, prompts: dict[int, list[int]], device: torch.device, repeat: int, checked: bool) -> dict:
    row: dict = {"latency_ms": {}, "bitwise_equal_eager": {}, "graphs": engine.stats.graphs_captured,
                 "pool_mib": engine.stats.graph_pool_bytes / 2**20}
    for n, p in prompts.items():
        batch = engine.prefill_batch([p])
        row["latency_ms"][n] = median_ms(lambda b=batch: engine.forward(b), device, warmup=3, repeat=repeat)
        if checked:
            out = engine.forward(batch).clone()
            row["bitwise_equal_eager"][n] = bool(torch.equal(out, engine.forward(batch, eager=True)))
    return row


def slowest(ms: float, device: torch.device) -> float:
    """The largest of every rank's `ms` (collective: every rank calls it, in the same order)."""
    t = torch.tensor([ms], dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def table(result: dict, tokens: list[int]) -> str:
    rows = result["rows"]
    full = rows["full"]["latency_ms"]
    lines = [f"collectives on {result['ranks']} rank(s), {result['model']} ({result['layers']} layers, {result['dtype']}), "
             f"{result['env'].get('gpu', 'cpu')}",
             "| config | " + " | ".join(f"{n} tok ms" for n in tokens) + " | × full (captured) | bitwise |",
             "|---|" + "---|" * (len(tokens) + 2)]
    for name, row in rows.items():
        ms = row["latency_ms"]
        ratio = ", ".join(f"{ms[n] / full[n]:.2f}" for n in tokens)
        bitwise = "yes" if all(row["bitwise_equal_eager"].values()) else "NO"
        lines.append(f"| {name} | " + " | ".join(f"{ms[n]:.2f} ({row['slowest_ms'][n]:.2f})" for n in tokens)
                     + f" | {ratio} | {bitwise if row['bitwise_equal_eager'] else '-'} |")
    lines.append("ms: rank 0's median (the slowest rank's)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="config.json, model directory or hub id")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attention", default="flex")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", default="8,128,512,2048")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)

    group = world(args.device)
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if args.device == "cuda" else args.device)
    tokens = [int(t) for t in args.tokens.split(",")]
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(0)

    def model():
        return load_model(args.model, layers=args.layers, tiny=args.tiny, weights="synthetic", dtype=dtype,
                          device=device, seed=0)

    lm = model()
    prompts = {n: torch.randint(0, lm.config.vocab_size, (n,), generator=gen).tolist() for n in tokens}
    config = EngineConfig(device=str(device), dtype=args.dtype, kv_slots=max(tokens) + 256, attention=args.attention)

    def engine(m, backend):
        return Engine(m, replace(config, capture=CaptureConfig(backend=backend, max_tokens=max(tokens))))

    result: dict = {"model": args.model, "layers": lm.config.num_hidden_layers, "dtype": args.dtype, "ranks": group.size,
                    "attention": args.attention, "env": environment(), "rows": {}}
    plans = []
    if group.size == 1:
        plans.append((FLOOR, lm.model, "full", False))
        lm = model()
    record = shard_model(lm.model, group)
    result["all_reduces"] = record.all_reduces
    plans += [(b, lm.model, b, True) for b in BACKENDS]
    for name, m, backend, checked in plans:
        row = measure(engine(m, backend), prompts, device, args.repeat, checked)
        row["slowest_ms"] = {n: slowest(ms, device) for n, ms in row["latency_ms"].items()}
        result["rows"][name] = row
        print(f"[rank {group.rank}] {name:18s} " + ", ".join(f"{n}: {ms:.2f} ms" for n, ms in row["latency_ms"].items()), flush=True)
    if group.rank == 0:
        print(table(result, tokens))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2))
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
