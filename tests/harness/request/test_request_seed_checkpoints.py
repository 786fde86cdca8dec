"""`pcgh request` for the quantized seed checkpoints people run, by hub id (offline: each card's config in the hub
cache): Kimi-K2-Thinking's compressed-tensors int4 experts are read as gptq, Kimi-K2-Instruct-0905's FP8 blocks
as fp8_block, and each request is linked to its card. What the loader refuses in such a declaration turns the
quantization verdict down."""

from __future__ import annotations

import copy

import pytest

from harness.cards import load_cards

from request_helpers import cache_config

COMMIT = "4" * 40


@pytest.mark.parametrize("card_id, hub_id, quant_reason, described", [
    ("kimi-k2-thinking", "moonshotai/Kimi-K2-Thinking", "compressed-tensors (as gptq) supported by the runtime",
     "compressed-tensors (weight_bits 4, weight_type int, group 32)"),
    ("kimi-k2-instruct-0905", "moonshotai/Kimi-K2-Instruct-0905", "fp8 (as fp8_block) supported by the runtime",
     "fp8 (fmt e4m3, block 128x128, dynamic activations)"),
])
def test_the_hub_id_gets_its_cards_verdicts(request_json, offline, card_id, hub_id, quant_reason, described):
    card = load_cards()[card_id]
    assert card.hub_id == hub_id
    cache_config(offline, hub_id, card.config, COMMIT)
    r = request_json(hub_id)
    assert (r["hub_id"], r["card_id"], r["architecture"], r["supported"]) == (hub_id, card_id, "DeepseekV3ForCausalLM", True)
    assert r["features"] == ["moe", "mla", "rope_scaling"]
    assert r["feature_details"]["rope_scaling"]["factor"] == 64.0  # YaRN to 256K, not K2-Instruct's 32
    v = r["verdicts"]
    assert v["model"]["ok"] and v["attention"]["ok"] and v["graph"]["ok"]
    assert v["quant"]["ok"] and v["quant"]["reason"] == f"{quant_reason}; checkpoint: {described}", v["quant"]
    assert not v["parallel"]["ok"] and "17 H200s" in v["parallel"]["reason"]  # 1T parameters in bf16


def test_k2_thinking_asked_as_gptq_runs_and_as_awq_means_other_weights(request_json, offline):
    card = load_cards()["kimi-k2-thinking"]
    cache_config(offline, card.hub_id, card.config, COMMIT)
    q = request_json(card.hub_id, "--quant", "compressed-tensors", "--quant", "gptq")["verdicts"]["quant"]
    assert q["ok"] and q["reason"].startswith("compressed-tensors (as gptq), gptq supported by the runtime"), q
    q = request_json(card.hub_id, "--quant", "awq")["verdicts"]["quant"]
    assert q["ok"] and "the published weights are compressed-tensors, so awq means synthetic or dequantized" in q["reason"]


@pytest.mark.parametrize("change, words", [
    ({"group_size": 16}, "compressed-tensors group_size 16: the int4 loader reads groups of -1, 32, 64, 128"),
    ({"type": "float"}, "float weights: pack-quantized 4-bit weights are read as static int weights"),
])
def test_a_k2_thinking_declaration_the_loader_refuses_turns_the_quant_verdict_down(request_json, offline, change, words):
    config = copy.deepcopy(load_cards()["kimi-k2-thinking"].config)
    config["quantization_config"]["config_groups"]["group_0"]["weights"].update(change)
    cache_config(offline, "pcg-test/Kimi-K2-Thinking-Altered", config, COMMIT)
    r = request_json("pcg-test/Kimi-K2-Thinking-Altered")
    assert r["card_id"] is None and r["supported"]
    q = r["verdicts"]["quant"]
    assert not q["ok"] and words in q["reason"], q
