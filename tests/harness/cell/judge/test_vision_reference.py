"""The judge's reference layer covers the vision path: pcg's eager outputs on the image+text case are held to
transformers' whole multimodal forward (its own vision tower, merge, get_rope_index and deepstack), so a fault in
pcg's eager pre-process, which the graph shares and graph-vs-eager cannot see, fails the layer."""

from __future__ import annotations

import pytest

from harness.cards import load_cards
from harness.cell.prompts import prompt_suite, run_case
from harness.cell.judge.reference import reference_layer
from pcg_core.config import CaptureConfig, EngineConfig
from pcg_core.engine import Engine
from pcg_core.engine.vision import VisionInputs
from pcg_core.model import load_model
from pcg_core.model.vision import text_token_limit


@pytest.fixture(scope="module", params=["qwen2.5-vl-7b", "qwen3-vl-30b-a3b"])
def setup(request):
    lm = load_model(load_cards()[request.param].config, tiny=True)
    config = EngineConfig(device="cpu", dtype="float32", capture=CaptureConfig(backend="disabled", max_tokens=32),
                          kv_slots=256)
    cases = [c for c in prompt_suite(config.capture.ladder, text_token_limit(lm.config), max_new_tokens=4,
                                     model_config=lm.config) if c.name.startswith("vision_mixed")]
    return lm, config, cases


def _outputs(lm, config, cases):
    engine = Engine(lm.model, config)
    return {c.name: run_case(engine, c, 2) for c in cases}


def test_reference_layer_passes_the_vision_case(setup):
    lm, config, cases = setup
    check = reference_layer(lm.model, config, cases, _outputs(lm, config, cases), quantized=False)
    assert check.status == "pass", check.reason


def test_reference_layer_catches_a_stale_rope_delta(setup, monkeypatch):
    lm, config, cases = setup
    orig = VisionInputs._prepare_one

    def stale(self, *args):
        info = orig(self, *args)
        info.rope_delta = 0  # decode positions without this sequence's delta
        return info

    monkeypatch.setattr(VisionInputs, "_prepare_one", stale)
    check = reference_layer(lm.model, config, cases, _outputs(lm, config, cases), quantized=False)
    assert check.status == "fail", check.reason
