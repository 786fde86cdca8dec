"""Qwen3-Next tiny on CUDA (skipped without one): graphs around the eager linear-attention op. piecewise with graphed
attention must leave pcg::linear_attention eager (it loops on the host) and still match eager; never run yet."""

import pytest
import torch

from pcg_core import CaptureConfig, Engine, EngineConfig, load_model
from pcg_helpers import compare_outputs, prompts_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def lm(configs):
    return load_model(configs / "Qwen__Qwen3-Next-80B-A3B-Instruct.json", tiny=True, dtype=torch.bfloat16, device="cuda")


def _engine(lm, backend):
    return Engine(lm.model, EngineConfig(device="cuda", dtype="bfloat16", kv_slots=1024,
                                         capture=CaptureConfig(backend=backend, max_tokens=128)))


@pytest.mark.parametrize("backend", ["piecewise", "breakable"])
def test_graphs_around_linear_attention_match_eager(lm, backend):
    prompts = prompts_of([70, 5, 1, 33], lm.config.vocab_size, seed=3)
    want = _engine(lm, "disabled").generate(prompts, max_new_tokens=9, prompt_logprobs=True)
    engine = _engine(lm, backend)
    got = engine.generate(prompts, max_new_tokens=9, prompt_logprobs=True)
    assert compare_outputs(want, got, 0.1, divergence="topk") == []
    if backend == "piecewise":  # the full-attention layer's op graphed, the linear layer's not
        assert engine.stats.graphed_split_ops == engine.stats.split_ops - 1
