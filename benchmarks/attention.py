"""Attention alone, per layer: each backend against SDPA-flash on dense causal attention of the same shape.

    python benchmarks/attention.py            # Qwen3-0.6B heads: 16 query / 8 KV, head dim 128, bf16

Cases (the issue's targets): one 2048-token prefill (vs `F.scaled_dot_product_attention(is_causal=True)` on the
dense [1, H, 2048, D] tensors, flash kernel forced), and 8 decode rows over 512 tokens of context each. Each
backend runs its whole op (KV write, its metadata already built, the kernel, padding rows zeroed) recorded in a
CUDA graph and replayed, as under `full` capture, and also called directly, as between piecewise graphs; medians
of CUDA-event timings after warm-up. --json writes the numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from harness.cell.timing import median_ms
from pcg_core.attention import KVCache, LayerParams, get_attention_backend
from pcg_core.engine.inputs import InputBuffers, PackedBatch

BACKENDS = ("sdpa", "flex", "varlen")


def _batch(cache: KVCache, runs: list[tuple[int, int]]) -> PackedBatch:
    """runs: (context, new tokens) per sequence; the new tokens are the last of the context. The cached keys and
    values depend only on (sequence, position), so every backend's cache holds the same history."""
    cache.reset()
    b = PackedBatch([], [], [], [])
    for s, (ctx, new) in enumerate(runs):
        slots = cache.allocate(s, ctx)
        g = torch.Generator(device=cache.k[0].device).manual_seed(1000 + s)
        idx = torch.tensor(slots, device=cache.k[0].device)
        for t in cache.k + cache.v:
            t[idx] = torch.randn((ctx, *t.shape[1:]), generator=g, device=t.device, dtype=t.dtype)
        b.token_ids += [0] * new
        b.positions += list(range(ctx - new, ctx))
        b.seq_ids += [s] * new
        b.slots += slots[ctx - new :]
    return b


def bench_backend(name: str, cfg, runs, kv_slots: int, dtype, device, repeat: int) -> dict:
    cls = get_attention_backend(name)
    cache = KVCache(cfg, kv_slots, dtype, device, page_size=cls.page_size)
    batch = _batch(cache, runs)
    n = len(batch)
    inputs = InputBuffers(n, cache, device)
    _, _, md = inputs.fill(batch, n)
    backend = cls(cache, n)
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(n, cfg.num_attention_heads, cfg.head_dim, device=device, dtype=dtype, generator=g)
    k = torch.randn(n, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype, generator=g)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    params = LayerParams(0, cfg.head_dim ** -0.5)

    def op():
        backend.forward(q, k, v, out, params, md)

    def direct():
        backend.begin_forward(md)
        op()

    res = {"direct_ms": median_ms(direct, device, warmup=5, repeat=repeat)}
    backend.begin_forward(md)
    op()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=s):
            op()
    torch.cuda.current_stream().wait_stream(s)
    backend.begin_forward(md)
    res["graph_ms"] = median_ms(graph.replay, device, warmup=5, repeat=repeat)
    graph.replay()
    res["out"] = out.clone()
    return res


def dense_flash_ms(cfg, tokens: int, dtype, device, repeat: int) -> float:
    q = torch.randn(1, cfg.num_attention_heads, tokens, cfg.head_dim, device=device, dtype=dtype)
    k = torch.randn(1, cfg.num_key_value_heads, tokens, cfg.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return median_ms(run, device, warmup=5, repeat=repeat)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kv-slots", type=int, default=8192, help="cache capacity (sdpa reads all of it)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    device, dtype = torch.device("cuda"), torch.bfloat16
    cfg = SimpleNamespace(num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                          hidden_size=args.heads * args.head_dim, num_hidden_layers=1)
    cases = {"prefill_1x2048": [(2048, 2048)], "decode_8x512": [(512, 1)] * 8}
    result: dict = {"shape": vars(args), "cases": {}}
    for case, runs in cases.items():
        row: dict = {}
        if case.startswith("prefill"):
            row["sdpa_flash_dense_ms"] = dense_flash_ms(cfg, runs[0][0], dtype, device, args.repeat)
        outs = {}
        for name in args.backends.split(","):
            try:
                r = bench_backend(name, cfg, runs, args.kv_slots, dtype, device, args.repeat)
                outs[name] = r.pop("out")
                row[name] = r
            except Exception as e:  # noqa: BLE001 - a backend that fails is a row with its error, not a crash
                row[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        ref = outs.get("sdpa")
        for name, o in outs.items():
            if ref is not None and name != "sdpa":
                row[name]["max_abs_diff_vs_sdpa"] = float((o.float() - ref.float()).abs().max())
        result["cases"][case] = row
    print(f"\nattention per layer, {args.heads}/{args.kv_heads} heads × {args.head_dim}, bf16, cache {args.kv_slots} slots")
    print("case | backend | graph ms | direct ms | vs SDPA-flash dense | max |Δ| vs sdpa")
    for case, row in result["cases"].items():
        dense = row.get("sdpa_flash_dense_ms")
        if dense:
            print(f"{case} | sdpa-flash dense causal | {dense:.4f} | | 1.00 |")
        for name in args.backends.split(","):
            r = row[name]
            if "error" in r:
                print(f"{case} | {name} | error: {r['error']}")
                continue
            ratio = f"{r['graph_ms'] / dense:.2f}" if dense else ""
            print(f"{case} | {name} | {r['graph_ms']:.4f} | {r['direct_ms']:.4f} | {ratio} | {r.get('max_abs_diff_vs_sdpa', 0):.3g}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
