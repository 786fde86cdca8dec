"""pcg's engine behind SGLang's native API: `/generate` (token ids in, greedy tokens and logprobs out), `/health`
and `/metrics` with SGLang's own counter of forwards by how they ran (`sglang:cuda_graph_passes_total`).

It is what the SGLang client, the replay proof and the judge's SGLang path are tested against on a CPU, and a way
to put pcg's engine where a tool expects an SGLang server. One request runs at a time (the engine is one batch).
A forward counts as a graph pass only where the engine holds CUDA graphs and replayed that forward.
"""

from __future__ import annotations

import threading

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, generate_latest

from harness.sglang.api import GENERATE, GRAPH_PASSES, HEALTH, METRICS, GenerateRequest, GenerateResult, MetaInfo, triples
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
