"""A cell's axes as `sglang.launch_server` flags, for the two servers an SGLang cell compares.

Both servers get the same model, weights, quantization, attention backend, KV-cache dtype, parallel layout, seed and
decode settings; they differ in one flag, `--cuda-graph-backend-prefill`: the cell's backend (`full` or
`breakable`) on the candidate, `disabled` on the reference. Decode runs without graphs on both, so the reference is
eager throughout and the candidate differs from it only where the cell asks.

The names are sglang 0.5.23's (its ServerArgs parser: tests/harness/sglang/test_flags.py parses every SGLang cell
of the nightly matrix with it, in an environment of its own). Where the axes name something SGLang has no flag for,
`unsupported_reason` says so and no flags are made.
"""

from __future__ import annotations

from pathlib import Path

from harness.cell.spec import CellSpec
from pcg_core.known import parse_parallel

SGLANG_VERSION = "0.5.23"  # the ServerArgs these flags are checked against
GRAPHS = ("full", "breakable")  # SGLang's prefill graph backends (0.5.23 removed its torch.compile piecewise one)
# pcg's attention backends → SGLang's of the same kernels: SDPA, FlexAttention, FlashAttention's varlen (FA3 on Hopper)
ATTENTION = {"sdpa": "torch_native", "flex": "flex_attention", "varlen": "fa3"}
# pcg's schemes → SGLang's --quantization (the checkpoint's quantization_config carries the layout: block sizes,
# group sizes, which layers)
QUANT: dict[str, str | None] = {
    "none": None, "fp8_per_tensor": "fp8", "fp8_block": "fp8", "fp8_per_token": "w8a8_fp8",
    "int8_w8a8": "w8a8_int8", "awq": "awq", "gptq": "gptq", "nvfp4": "modelopt_fp4", "mxfp4": "mxfp4",
    "w4afp8": "w4afp8",
}
KV_CACHE = {"auto": "auto", "fp8_e4m3": "fp8_e4m3"}


def unsupported_reason(spec: CellSpec) -> str | None:
    """Why these axes have no SGLang server flags (None: they have)."""
    if spec.graph not in GRAPHS:
        return (f"SGLang {SGLANG_VERSION} has no {spec.graph!r} prefill graph backend: it captures prefill "
                f"{' or '.join(GRAPHS)} (its torch.compile piecewise backend was removed)")
    if spec.compiler != "eager":
        return f"an SGLang cell runs SGLang's own kernels; compiler {spec.compiler!r} is pcg's (use eager)"
    if spec.attention not in ATTENTION:
        return f"attention {spec.attention!r} has no SGLang backend here (mapped: {_pairs(ATTENTION)})"
    if spec.quant not in QUANT:
        return f"SGLang {SGLANG_VERSION} loads no {spec.quant!r} checkpoint (mapped: {', '.join(QUANT)})"
    if spec.kv_cache not in KV_CACHE:
        return f"KV cache {spec.kv_cache!r} has no SGLang --kv-cache-dtype here (mapped: {', '.join(KV_CACHE)})"
    try:
        parse_parallel(spec.parallel)
    except ValueError as e:
        return str(e)
    return None


def _pairs(mapping: dict[str, str]) -> str:
    return ", ".join(f"{k} → {v}" for k, v in mapping.items())


def parallel_flags(mode: str) -> list[str]:
    """pcg's parallel mode as SGLang's sizes. SGLang's --tp-size counts every GPU of a pipeline stage; data-parallel
    attention (--dp-size with --enable-dp-attention) splits them into attention groups, and --ep-size spreads the
    experts over them: pcg's tp·dp attention ranks, or ep where it is larger (the rest data-parallel groups)."""
    d = parse_parallel(mode)
    tp, pp, dp, ep = (d.get(k, 1) for k in ("tp", "pp", "dp", "ep"))
    gpus = max(tp * dp, ep)
    groups = gpus // tp  # attention groups of tp ranks each
    out = []
    if gpus > 1:
        out += ["--tp-size", str(gpus)]
    if groups > 1:
        out += ["--dp-size", str(groups), "--enable-dp-attention"]
    if ep > 1:
        out += ["--ep-size", str(ep)]
    if pp > 1:
        out += ["--pp-size", str(pp)]
    return out


def server_flags(spec: CellSpec, model_path: str | Path, port: int, prefill_graphs: bool) -> list[str]:
    """`python -m sglang.launch_server` arguments for one of the cell's two servers: the candidate
    (`prefill_graphs`: the cell's backend, buckets up to its largest) or the eager reference. model_path: the
    checkpoint folder, or for synthetic weights a folder with the (trimmed) config.json, loaded as dummy weights
    (SGLang initializes them from a fixed seed, so both servers hold the same). Token ids in and out: no tokenizer."""
    if why := unsupported_reason(spec):
        raise ValueError(why)
    flags = ["--model-path", str(model_path), "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
             "--dtype", spec.resolved_dtype, "--random-seed", str(spec.seed),
             "--attention-backend", ATTENTION[spec.attention], "--kv-cache-dtype", KV_CACHE[spec.kv_cache],
             "--cuda-graph-backend-decode", "disabled", "--enable-metrics"]  # /metrics: the replay proof
    if spec.weights == "synthetic":
        flags += ["--load-format", "dummy"]
    if (quant := QUANT[spec.quant]) is not None:
        flags += ["--quantization", quant]
    flags += parallel_flags(spec.parallel)
    if prefill_graphs:
        flags += ["--cuda-graph-backend-prefill", spec.graph, "--cuda-graph-max-bs-prefill", str(spec.resolved_max_tokens)]
    else:
        flags += ["--cuda-graph-backend-prefill", "disabled"]
    return flags

