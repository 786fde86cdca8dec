"""Sliding-window attention (Qwen3 with use_sliding_window) against transformers' own forward."""

import copy
import json

import torch
from transformers import AutoModelForCausalLM

from pcg_core import CaptureConfig, Engine, EngineConfig, load_model


def _hf_prompt_logprobs(config, state_dict, prompt):
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    ref.load_state_dict(state_dict)
    with torch.no_grad():
        lp = torch.log_softmax(ref(input_ids=torch.tensor([prompt])).logits[0].float(), -1)
    return lp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()


def test_sliding_window_matches_transformers(configs):
    cfg = json.loads((configs / "Qwen__Qwen3-8B.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    lm = load_model(cfg, tiny=True, layers=2)
    assert lm.config.layer_types == ["sliding_attention"] * 2
    prompt = list(range(3, 40))  # longer than the window, so the window changes the result
    engine = Engine(lm.model, EngineConfig(capture=CaptureConfig(backend="piecewise", max_tokens=64), kv_slots=256))
    ours = engine.generate([prompt], max_new_tokens=2, prompt_logprobs=True)[0].prompt_logprobs
    windowed = _hf_prompt_logprobs(lm.config, lm.model.state_dict(), prompt)
    assert max(abs(a - b) for a, b in zip(ours, windowed)) < 1e-4  # fp32, reduction order only

    full_cfg = copy.deepcopy(lm.config)
    full_cfg.layer_types = ["full_attention"] * 2
    full_cfg.sliding_window = None
    unwindowed = _hf_prompt_logprobs(full_cfg, lm.model.state_dict(), prompt)
    assert max(abs(a - b) for a, b in zip(ours, unwindowed)) > 1e-3  # the window really was applied
