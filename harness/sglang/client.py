"""A client of an SGLang server (or anything speaking its native API: pcg_server.py): health, the prompt suite
through `/generate`, and the server's own count of the forwards its prefill graphs replayed."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.sglang.api import (FLUSH, GENERATE, GRAPH_PASSES, HEALTH, METRICS, GenerateRequest, GenerateResult,
                                SamplingParams)
from pcg_core.engine import SequenceOutput


@dataclass(frozen=True)
class GraphPasses:
    """Forwards by how they ran, as the server counts them (sglang:cuda_graph_passes_total)."""

    prefill_graph: float = 0.0
    prefill_eager: float = 0.0

    def since(self, before: GraphPasses) -> GraphPasses:
        return GraphPasses(self.prefill_graph - before.prefill_graph, self.prefill_eager - before.prefill_eager)


def parse_graph_passes(text: str) -> GraphPasses:
    """The prefill counters of a Prometheus text page; a page without them (a server started without
    --enable-metrics, or not SGLang) is an error: no proof is not a proof of replay."""
    found: dict[str, float] = {}
    declared = False  # a counter no forward has moved yet has no samples, but the page declares it
    for family in text_string_to_metric_families(text):
        declared |= family.name == GRAPH_PASSES.removesuffix("_total")
        for sample in family.samples:
            if sample.name == GRAPH_PASSES:
                mode = sample.labels.get("mode", "")
                found[mode] = found.get(mode, 0.0) + sample.value
    if not declared:
        raise ValueError(f"the server's {METRICS} has no {GRAPH_PASSES} (started without --enable-metrics?)")
    return GraphPasses(found.get("prefill_cuda_graph", 0.0), found.get("prefill_none", 0.0))


class SGLangClient:
    """One server at `base_url` (http://127.0.0.1:PORT)."""

    def __init__(self, base_url: str, timeout_s: float = 600.0):
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def healthy(self) -> bool:
        try:
            return self.http.get(HEALTH, timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Until /health answers 200; TimeoutError after timeout_s (the caller tears the server down)."""
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.http.base_url} not healthy after {timeout_s:.0f} s")
            time.sleep(poll_s)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, top_k: int) -> list[SequenceOutput]:
        """Greedy continuations of `prompts` in one request (the server batches them as it schedules), each with its
        prompt's and its own logprobs and top-k, as pcg's engine reports them."""
        request = GenerateRequest(input_ids=prompts, sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
                                  top_logprobs_num=top_k)
        r = self.http.post(GENERATE, json=request.model_dump())
        r.raise_for_status()
        body = r.json()
        results = body if isinstance(body, list) else [body]
        if len(results) != len(prompts):
            raise ValueError(f"{GENERATE} answered {len(results)} sequences for {len(prompts)} prompts")
        return [GenerateResult.model_validate(x).to_output(p) for x, p in zip(results, prompts)]

    def flush_cache(self) -> None:
        """Drop what the server's prefix cache holds, so a second run of the suite computes what the first did."""
        self.http.post(FLUSH).raise_for_status()

    def graph_passes(self) -> GraphPasses:
        r = self.http.get(METRICS)
        r.raise_for_status()
        return parse_graph_passes(r.text)
