"""pcg's engine behind SGLang's native API: `/generate` (token ids in, greedy tokens and logprobs out), `/health`
and `/metrics` with SGLang's own counter of forwards by how they ran (`sglang:cuda_graph_passes_total`).

It is what the SGLang client, the replay proof and the judge's SGLang path are tested against on a CPU, and a way
to put pcg's engine where a tool expects an SGLang server. One request runs at a time (the engine is one batch).
A forward counts as a graph pass only where the engine holds CUDA graphs and replayed that forward.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, generate_latest

from harness.sglang.api import (FLUSH, GENERATE, GRAPH_PASSES, HEALTH, METRICS, GenerateRequest, GenerateResult, MetaInfo,
                                triples)
from pcg_core.engine import Engine, SequenceOutput


def make_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="pcg behind SGLang's /generate")
    registry = CollectorRegistry()
    passes = Counter(GRAPH_PASSES.removesuffix("_total"), "Forwards by phase and whether a CUDA graph ran them",
                     ["mode"], registry=registry)
    graphs = engine.device.type == "cuda" and engine.backend.pads

    def count(batch, bucket, replay: bool, decode: bool) -> None:
        passes.labels(mode=f"{'decode' if decode else 'prefill'}_{'cuda_graph' if replay and graphs else 'none'}").inc()

    engine.on_forward = count
    lock = threading.Lock()

    @app.get(HEALTH)
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(FLUSH)
    def flush() -> dict[str, str]:
        return {"status": "ok"}  # every generate() starts from an empty cache

    @app.get(METRICS, response_class=PlainTextResponse)
    def metrics() -> str:
        return generate_latest(registry).decode()

    @app.post(GENERATE)
    def generate(request: GenerateRequest) -> list[GenerateResult]:
        params = request.sampling_params
        if params.temperature != 0:
            raise HTTPException(422, "pcg generates greedily: sampling_params.temperature must be 0")
        if params.max_new_tokens < 1 or request.logprob_start_len != 0:
            raise HTTPException(422, "pcg needs max_new_tokens ≥ 1 and logprob_start_len 0 (every prompt position)")
        if any(not p for p in request.input_ids):
            raise HTTPException(422, "every prompt needs at least one token")
        with lock:
            outs = engine.generate(request.input_ids, max_new_tokens=params.max_new_tokens,
                                   top_k=max(request.top_logprobs_num, 1), prompt_logprobs=True)
        return [_result(o, request.top_logprobs_num) for o in outs]

    return app


def _result(o: SequenceOutput, top_k: int) -> GenerateResult:
    """SGLang's shape of one sequence: position i's logprob is of token i (none for the first), its top-k the
    distribution before it."""
    assert o.prompt_logprobs is not None and o.prompt_topk_ids is not None and o.prompt_topk_logprobs is not None
    prompt = o.prompt_ids
    tops = [triples(lps[:top_k], ids[:top_k]) if top_k else None
            for ids, lps in zip(o.prompt_topk_ids, o.prompt_topk_logprobs)]
    out_tops = [triples(lps[:top_k], ids[:top_k]) if top_k else None
                for ids, lps in zip(o.output_topk_ids, o.output_topk_logprobs)]
    meta = MetaInfo(input_token_logprobs=[(None, prompt[0], None), *triples(o.prompt_logprobs, prompt[1:])],
                    output_token_logprobs=triples(o.output_logprobs, o.output_ids),
                    input_top_logprobs=[None, *tops[:-1]], output_top_logprobs=out_tops)
    return GenerateResult(output_ids=o.output_ids, meta_info=meta)


# `python -m harness.sglang.pcg_server FLAGS`: the launch_server flags an SGLang cell gives its servers, served by
# pcg's engine (SGLang's backend names mapped back to pcg's; its dummy weights as pcg's synthetic ones, seeded).
_BACK = {"torch_native": "sdpa", "flex_attention": "flex", "fa3": "varlen"}
_PREFILL = {"full": "full", "breakable": "breakable", "disabled": "disabled"}


def parse_flags(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m harness.sglang.pcg_server",
                                description="pcg's engine behind SGLang's native API, from launch_server's flags")
    p.add_argument("--model-path", required=True, help="a folder holding config.json")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--attention-backend", choices=sorted(_BACK), default="torch_native")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--load-format", choices=["dummy", "auto"], default="auto")
    p.add_argument("--cuda-graph-backend-prefill", choices=sorted(_PREFILL), default="disabled")
    p.add_argument("--cuda-graph-max-bs-prefill", type=int, default=None)
    p.add_argument("--cuda-graph-backend-decode", default="disabled", help="pcg's graphs serve both phases: ignored")
    p.add_argument("--skip-tokenizer-init", action="store_true", help="always: token ids in and out")
    p.add_argument("--enable-metrics", action="store_true", help="always on")
    return p.parse_args(argv)


def engine_from_flags(a: argparse.Namespace) -> Engine:
    import torch

    from pcg_core import CaptureConfig, EngineConfig, load_model

    config = json.loads((Path(a.model_path) / "config.json").read_text())
    if a.load_format == "auto" and not any(Path(a.model_path).glob("*.safetensors")):
        raise SystemExit(f"{a.model_path}: no weights; --load-format dummy serves the config with synthetic weights")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lm = load_model(config if a.load_format == "dummy" else a.model_path, weights="synthetic" if a.load_format == "dummy"
                    else "real", dtype=getattr(torch, a.dtype), device=device, seed=a.random_seed)
    max_tokens = a.cuda_graph_max_bs_prefill or (64 if device == "cpu" else 4096)
    return Engine(lm.model, EngineConfig(device=device, dtype=a.dtype, attention=_BACK[a.attention_backend],
                                         kv_cache=a.kv_cache_dtype,
                                         capture=CaptureConfig(backend=_PREFILL[a.cuda_graph_backend_prefill],
                                                               max_tokens=max_tokens)))


def main(argv: list[str] | None = None) -> None:
    import sys

    import uvicorn

    a = parse_flags(sys.argv[1:] if argv is None else argv)
    uvicorn.run(make_app(engine_from_flags(a)), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
