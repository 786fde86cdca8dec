"""Where a direct flex call's time goes (issue 38: breakable on flex is 1.7-1.9× full at 8-128 tokens, the GPU
time equal: host time in the attention holes). One layer's `FlexBackend.forward` over a 28-layer-like cache, and
its parts, each timed two ways: host µs per call (many calls enqueued back to back, no sync; what a hole costs
the host) and GPU ms (CUDA events, medians). The parts:

- forward      — the whole op as a breakable hole runs it (metadata already built by begin_forward)
- kernel+patch — the compiled flex callable with dynamo's config patched around it (what forward did until
                 2026-12-05: the cost that patch added to every hole)
- kernel       — the same callable through dynamo, without the patch
- direct       — the same kernel past dynamo: inductor's artifact with the call's tensors (what forward does now,
                 pcg_core/attention/flex_kernel.py)
- around       — forward's eager ops without the kernel: KV write, cache read, permutes, query pad, zero_padding

    python benchmarks/flex_call.py [--cases decode_8x512,prefill_1x128,prefill_1x2048] [--kernels decoding,main] [--json OUT]

--kernels: flex as it is (`decoding`: inductor's decoding kernel under 128 rows where the head group fits) and with
its main kernel at every row count (`main`, FlexBackend.decoding_kernel = False), each case under each.

Ends with the torch profiler's top host ops of 20 forward calls. On a CPU it runs the compiled path too (inductor's
CPU flex): slow, only to check the script.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from attention import _batch  # benchmarks/, beside this script
from harness.cell.timing import median_ms
from pcg_core.attention import KVCache, LayerParams
from pcg_core.attention import flex as flex_module
from pcg_core.attention.backend import write_kv, zero_padding
from pcg_core.attention.flex import FlexBackend
from pcg_core.engine.inputs import InputBuffers

CASES = {"decode_8x512": [(512, 1)] * 8, "decode_32x512": [(512, 1)] * 32, "prefill_1x8": [(8, 8)],
         "prefill_1x32": [(32, 32)], "prefill_1x128": [(128, 128)], "prefill_1x2048": [(2048, 2048)]}
KERNELS = ("decoding", "main")


def host_us(fn, calls: int) -> float:
    """Host time per call: `calls` calls enqueued without a sync (the GPU may lag; the host does not wait)."""
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls * 1e6
    _sync()
    return t


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_case(runs, cfg, dtype, device, calls: int, repeat: int, kernels: str = "decoding") -> dict:
    """One case under one of KERNELS (`kernels`: decoding, flex as it is; main, its main kernel at every row count)."""
    cache = KVCache(cfg, 8192, dtype, device, page_size=FlexBackend.page_size)
    batch = _batch(cache, runs)
    n = len(batch)
    md = InputBuffers(n, cache, device).fill(batch, n)[2]
    flex = FlexBackend(cache, n)
    flex._compiled = True  # also on a CPU (inductor's CPU flex), to check the script
    flex.decoding_kernel = kernels == "decoding"
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(n, cfg.num_attention_heads, cfg.head_dim, device=device, dtype=dtype, generator=g)
    k = torch.randn(n, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype, generator=g)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    params = LayerParams(0, cfg.head_dim ** -0.5)
    flex.begin_forward(md)
    flex.forward(q, k, v, out, params, md)  # compiles, learns the window

    # the kernel's own call, as forward builds it
    keys, values = cache.read(0)
    keys, values = keys.permute(1, 0, 2).unsqueeze(0), values.permute(1, 0, 2).unsqueeze(0)
    rows = flex_module.flex_rows(n)
    query = torch.nn.functional.pad(q.transpose(0, 1).unsqueeze(0), (0, 0, 0, rows - n))
    bm = flex.block_mask(md, 0)
    gqa = q.shape[1] != k.shape[1]
    decoding = flex.decoding_kernel and flex_module._decode_kernel_fits(rows, q.shape[1] // k.shape[1])
    kw = {} if decoding else {"kernel_options": {"FORCE_USE_FLEX_ATTENTION": True}}
    fn = flex._kernel((rows, 0, 0.0, 0, False, gqa, tuple(sorted(kw.get("kernel_options", {}).items()))))
    call_args = (query, keys, values)
    call_kw = dict(score_mod=None, block_mask=bm, scale=params.scale, enable_gqa=gqa, **kw)

    def kernel():
        return fn(*call_args, direct=False, **call_kw)

    def kernel_limit():
        with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
            return fn(*call_args, direct=False, **call_kw)

    def direct():
        return fn(*call_args, direct=True, **call_kw)

    def around():
        write_kv(cache, 0, k, v, md.slot_mapping)
        ks, vs = cache.read(0)
        ks.permute(1, 0, 2).unsqueeze(0), vs.permute(1, 0, 2).unsqueeze(0)
        qq = torch.nn.functional.pad(q.transpose(0, 1).unsqueeze(0), (0, 0, 0, rows - n))
        zero_padding(out, qq[0, :, :n].transpose(0, 1), md.valid)

    parts = {"forward": lambda: flex.forward(q, k, v, out, params, md), "kernel+patch": kernel_limit,
             "kernel": kernel, "direct": direct, "around": around}
    row = {"direct_off": fn.direct_off} if fn.direct_off else {}
    if fn.direct_off:
        print(f"direct path off: {fn.direct_off}")
    for name, f in parts.items():
        row[name] = {"host_us": host_us(f, calls), "gpu_ms": median_ms(f, device, warmup=3, repeat=repeat)}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            flex.forward(q, k, v, out, params, md)
    row["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--kernels", default=",".join(KERNELS), help="decoding (flex as it is), main, or both")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
    cfg = SimpleNamespace(num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                          hidden_size=args.heads * args.head_dim, num_hidden_layers=1)
    result = {}
    for case in args.cases.split(","):
        for choice in args.kernels.split(","):
            result[f"{case}/{choice}"] = bench_case(CASES[case], cfg, dtype, device, args.calls, args.repeat, choice)
    for case, row in result.items():
        print(f"\n{case}: top host ops of 20 forward calls\n{row['profile']}")
    print(f"\nflex direct call, {args.heads}/{args.kv_heads} heads × {args.head_dim}, {dtype}, on {device}")
    print("case | part | host µs per call | GPU ms")
    for case, row in result.items():
        for name, r in row.items():
            if isinstance(r, dict):
                print(f"{case} | {name} | {r['host_us']:.1f} | {r['gpu_ms']:.4f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
