"""The SGLang client against a real HTTP server speaking SGLang's native API on the CPU — pcg's own engine behind
/generate (harness/sglang/pcg_server.py) — and the replay proof read from a server's /metrics."""

from __future__ import annotations

import socket
import threading

import pytest
import torch
import uvicorn

from harness.cards import find_card
from harness.sglang.api import GenerateResult, MetaInfo
from harness.sglang.client import GraphPasses, SGLangClient, parse_graph_passes
from harness.sglang.pcg_server import make_app
from pcg_core import CaptureConfig, Engine, EngineConfig, load_model

PROMPTS = [list(range(5, 24)), [7, 3, 9], list(range(40, 51))]


def _engine() -> Engine:
    torch.manual_seed(0)
    lm = load_model(find_card("qwen3-0.6b").config, tiny=True)
    return Engine(lm.model, EngineConfig(capture=CaptureConfig(backend="piecewise", max_tokens=64)))


@pytest.fixture(scope="module")
def served():
    """pcg's engine served over HTTP on a free port of this host; the engine too, to call it directly."""
    engine = _engine()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with SGLangClient(f"http://127.0.0.1:{port}", timeout_s=120) as client:
            client.wait_healthy(timeout_s=60, poll_s=0.1)
            yield client, engine
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_the_suite_through_http_is_what_the_engine_computes(served):
    client, engine = served
    got = client.generate(PROMPTS, max_new_tokens=4, top_k=3)
    want = engine.generate(PROMPTS, max_new_tokens=4, top_k=3, prompt_logprobs=True)
    for g, w in zip(got, want):
        # exactly: JSON carries a float's shortest repr, which reads back to the same float
        assert g.output_ids == w.output_ids and g.output_logprobs == w.output_logprobs
        assert g.prompt_logprobs == w.prompt_logprobs and len(g.prompt_logprobs) == len(w.prompt_ids) - 1
        assert g.prompt_topk_ids == w.prompt_topk_ids and g.output_topk_ids == w.output_topk_ids
        assert g.prompt_topk_logprobs == w.prompt_topk_logprobs and g.output_topk_logprobs == w.output_topk_logprobs


def test_the_server_counts_prefill_forwards_and_a_cpu_claims_no_graph(served):
    client, _ = served
    before = client.graph_passes()
    client.generate(PROMPTS[:2], max_new_tokens=2, top_k=1)
    delta = client.graph_passes().since(before)
    assert delta == GraphPasses(prefill_graph=0.0, prefill_eager=1.0)  # one packed prefill, no CUDA graph to replay


def test_bad_requests_are_refused_by_the_server(served):
    client, _ = served
    r = client.http.post("/generate", json={"input_ids": [[1, 2]], "sampling_params": {"max_new_tokens": 2,
                                                                                       "temperature": 0.7}})
    assert r.status_code == 422 and "greedily" in r.text
    assert client.http.post("/generate", json={"input_ids": [[1, 2]]}).status_code == 422  # no sampling_params


def test_sglangs_metrics_page_reads_and_a_page_without_them_is_no_proof():
    page = ('# HELP sglang:cuda_graph_passes_total Total passes\n# TYPE sglang:cuda_graph_passes_total counter\n'
            'sglang:cuda_graph_passes_total{model_name="m",mode="prefill_cuda_graph",dp_rank="0"} 5.0\n'
            'sglang:cuda_graph_passes_total{model_name="m",mode="prefill_cuda_graph",dp_rank="1"} 2.0\n'
            'sglang:cuda_graph_passes_total{model_name="m",mode="prefill_none",dp_rank="0"} 1.0\n'
            'sglang:cuda_graph_passes_total{model_name="m",mode="decode_cuda_graph",dp_rank="0"} 9.0\n')
    assert parse_graph_passes(page) == GraphPasses(prefill_graph=7.0, prefill_eager=1.0)
    with pytest.raises(ValueError, match="enable-metrics"):
        parse_graph_passes("# nothing here\nprocess_cpu_seconds_total 1.0\n")
    declared = "# HELP sglang:cuda_graph_passes_total Total\n# TYPE sglang:cuda_graph_passes_total counter\n"
    assert parse_graph_passes(declared) == GraphPasses()  # declared, no forward yet


def test_an_answer_short_of_prompt_logprobs_is_an_error_naming_it():
    result = GenerateResult(output_ids=[4], meta_info=MetaInfo(input_token_logprobs=[(None, 1, None)],
                                                               output_token_logprobs=[(-0.5, 4, None)]))
    with pytest.raises(ValueError, match="1 prompt logprobs for a prompt of 3 tokens"):
        result.to_output([1, 2, 3])
