"""SGLang's native `/generate` API, the part a cell speaks: token ids in, greedy tokens and logprobs out.

The request and the response as sglang 0.5.23 writes them (`GenerateReqInput`; the response's `meta_info` with
`skip_tokenizer_init`: each logprob a `[logprob, token_id, text]` triple, the text null, the first prompt position's
logprob null), typed here so that the client (client.py) and pcg's own server of the same API (pcg_server.py) agree,
and a server that answers something else is an error naming what is missing.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pcg_core.engine import SequenceOutput

GENERATE, HEALTH, METRICS, FLUSH = "/generate", "/health", "/metrics", "/flush_cache"
GRAPH_PASSES = "sglang:cuda_graph_passes_total"  # its `mode` label: prefill_cuda_graph, prefill_none, decode_…


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")  # SGLang takes many more; a cell sends these

    max_new_tokens: int = Field(ge=0)
    temperature: float = 0.0


class GenerateRequest(BaseModel):
    """A batch of prompts, greedy, with every prompt position's logprob and the top-k at each position."""

    input_ids: list[list[int]]
    sampling_params: SamplingParams
    return_logprob: bool = True
    logprob_start_len: int = 0  # from the first prompt token (SGLang's default, -1, gives the output's only)
    top_logprobs_num: int = 0


Triple = tuple[float | None, int, Any]  # (logprob, token id, text: null without a tokenizer)


class MetaInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_token_logprobs: list[Triple]
    output_token_logprobs: list[Triple]
    input_top_logprobs: list[list[Triple] | None] = Field(default_factory=list)
    output_top_logprobs: list[list[Triple] | None] = Field(default_factory=list)


class GenerateResult(BaseModel):
    """One sequence's answer."""

    model_config = ConfigDict(extra="allow")

    output_ids: list[int]
    meta_info: MetaInfo

    def to_output(self, prompt: list[int]) -> SequenceOutput:
        """As pcg's engine reports a sequence (prompt_logprobs[i] = log p(prompt[i+1] | prompt[:i+1])), so the judge
        reads both engines alike."""
        m = self.meta_info
        if len(m.input_token_logprobs) != len(prompt):
            raise ValueError(f"the server gave {len(m.input_token_logprobs)} prompt logprobs for a prompt of "
                             f"{len(prompt)} tokens (was logprob_start_len 0 honoured?)")
        top_out = [_top(t) for t in m.output_top_logprobs]
        # pcg's prompt top-k at row i is the distribution after prompt[:i+1]: SGLang's at position i+1, and after the
        # whole prompt its first output position's
        top_in = [_top(t) for t in m.input_top_logprobs[1:]] + top_out[:1]
        return SequenceOutput(
            prompt_ids=list(prompt), output_ids=list(self.output_ids),
            output_logprobs=[_value(t) for t in m.output_token_logprobs],
            output_topk_ids=[ids for ids, _ in top_out], output_topk_logprobs=[lps for _, lps in top_out],
            prompt_logprobs=[_value(t) for t in m.input_token_logprobs[1:]],
            prompt_topk_ids=[ids for ids, _ in top_in], prompt_topk_logprobs=[lps for _, lps in top_in])


def _value(t: Triple) -> float:
    if t[0] is None:
        raise ValueError(f"no logprob for token {t[1]}")
    return float(t[0])


def _top(entries: list[Triple] | None) -> tuple[list[int], list[float]]:
    entries = entries or []
    return [int(e[1]) for e in entries], [_value(e) for e in entries]


def triples(logprobs: list[float], ids: list[int]) -> list[Triple]:
    return [(float(lp), int(i), None) for lp, i in zip(logprobs, ids)]
