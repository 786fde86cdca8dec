"""Model cards: every shipped card loads; a broken config beside a card is named in the error; every checkpoint a
card declares, where the repository holds its config, is one the loader reads as the scheme the card names."""

import json

import pytest

from harness.cards import ModelCard, _load, load_cards
from harness.cell.spec import CellSpec
from harness.matrix.expand import Cell
from harness.matrix.precheck import precheck
from pcg_core.capabilities import capabilities
from pcg_core.errors import ConfigError


def test_shipped_cards_load_with_their_configs():
    cards = load_cards()
    assert {"qwen3-0.6b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "kimi-k2", "kimi-k2-thinking",
            "kimi-k2-instruct-0905", "grok-2"} <= set(cards)
    assert all(card.config.get("model_type") for card in cards.values())


def test_the_torch_free_architecture_verdict_agrees_with_the_full_one_on_every_shipped_card():
    """`pcgh models` shows architecture_reason (the table alone, no torch); the pre-check runs runtime_reason
    (transformers builds the config too). On the shipped cards they must say the same."""
    cards = load_cards()
    assert {c.id: c.architecture_reason for c in cards.values()} == {c.id: c.runtime_reason for c in cards.values()}
    assert cards["qwen3-0.6b"].architecture_reason is None
    assert cards["qwen3-next-80b-a3b"].architecture_reason is None  # linear attention runs (pcg_core/linear_attention)


def test_broken_config_file_beside_a_card_names_the_file(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    card = tmp_path / "m.yaml"
    card.write_text("id: m\nhub_id: org/m\narchitecture: X\nconfig: broken.json\n")
    with pytest.raises(ConfigError, match=r"broken\.json: not valid JSON"):
        _load(card)


def test_non_utf8_card_names_the_file_and_the_byte(tmp_path):
    card = tmp_path / "m.yaml"
    card.write_bytes("id: m\nhub_id: org/m\narchitecture: X\nconfig: {model_type: qwen3}\n# Ærø\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"m\.yaml: not UTF-8 text: byte 0xc6 at offset 66"):
        _load(card)


def test_non_utf8_config_beside_a_card_names_the_file(tmp_path):
    (tmp_path / "latin1.json").write_bytes('{"model_type": "qwen3", "note": "café"}'.encode("latin-1"))
    card = tmp_path / "m.yaml"
    card.write_text("id: m\nhub_id: org/m\narchitecture: X\nconfig: latin1.json\n")
    with pytest.raises(ConfigError, match=r"latin1\.json: not UTF-8 text: byte 0xe9 at offset 36"):
        _load(card)


def test_cards_declare_their_quantized_checkpoints(tmp_path):
    card = tmp_path / "m.yaml"
    card.write_text("id: m\nhub_id: org/m\narchitecture: X\nconfig: {model_type: qwen3}\nquantized: {fp8_block: org/m-FP8}\n")
    c = _load(card)
    assert c.checkpoint_for("none") == "org/m" and c.checkpoint_for("fp8_block") == "org/m-FP8"
    assert c.no_checkpoint_reason("fp8_block") is None
    why = c.no_checkpoint_reason("int8_w8a8")
    assert "declares no int8_w8a8 checkpoint" in why and "fp8_block (org/m-FP8)" in why and "m.yaml" in why
    shipped = load_cards()
    assert shipped["qwen3-8b"].checkpoint_for("fp8_block") == "Qwen/Qwen3-8B-FP8"


@pytest.mark.parametrize("value, words", [
    ("{fp9: org/x}", "unknown scheme 'fp9'"),
    ("{fp8_block: not-a-hub-id}", "not a hub id"),
    ("[fp8_block]", "maps a scheme to a hub id"),
])
def test_bad_quantized_declarations_name_the_card_and_the_fix(tmp_path, value, words):
    card = tmp_path / "m.yaml"
    card.write_text(f"id: m\nhub_id: org/m\narchitecture: X\nconfig: {{model_type: qwen3}}\nquantized: {value}\n")
    with pytest.raises(ConfigError, match="m.yaml") as e:
        _load(card)
    assert words in str(e.value)


def test_every_declared_checkpoint_the_repository_has_a_config_for_is_read_as_the_scheme_declared():
    """The loader's own reader (pcg_core.quant.detect) decides: a card cannot promise real-weights cells of a
    checkpoint whose quantization_config pcg refuses, or reads as another scheme."""
    cards = load_cards()
    checked = {(c.id, q) for c in cards.values() for q in c.quantized if c.checkpoint_config(q) is not None}
    assert {("kimi-k2-thinking", "gptq"), ("kimi-k2-instruct-0905", "fp8_block"), ("kimi-k2", "fp8_block"),
            ("deepseek-v3", "fp8_block"), ("gpt-oss-120b", "mxfp4")} <= checked
    assert {(i, q): why for i, q in sorted(checked) if (why := cards[i].checkpoint_reason(q))} == {}
    assert cards["kimi-k2-thinking"].checkpoint_for("gptq") == "moonshotai/Kimi-K2-Thinking"
    assert cards["kimi-k2-instruct-0905"].checkpoint_for("fp8_block") == "moonshotai/Kimi-K2-Instruct-0905"


def _thinking_variant(tmp_path, quantized: str, **weights) -> ModelCard:
    """A copy of the Kimi-K2-Thinking card with its quantized: entry replaced and its config's weight scheme
    changed by `weights`."""
    card = load_cards()["kimi-k2-thinking"]
    config = json.loads(json.dumps(card.config))
    config["quantization_config"]["config_groups"]["group_0"]["weights"].update(weights)
    path = tmp_path / "k2t.yaml"
    path.write_text(json.dumps({"id": "k2t", "hub_id": card.hub_id, "architecture": card.architecture, "config": config,
                                "quantized": json.loads(quantized)}))  # JSON is YAML
    return _load(path)


@pytest.mark.parametrize("quantized, weights, words", [
    ('{"gptq": "moonshotai/Kimi-K2-Thinking"}', {}, None),  # the shipped declaration, as a control
    ('{"awq": "moonshotai/Kimi-K2-Thinking"}', {}, "reads as gptq, not awq; declare it as `gptq: moonshotai/Kimi-K2-Thinking`"),
    ('{"gptq": "moonshotai/Kimi-K2-Thinking"}', {"group_size": 16}, "group_size 16: the int4 loader reads groups of"),
    ('{"gptq": "moonshotai/Kimi-K2-Thinking"}', {"num_bits": 2}, "with 2-bit weights: only 4-bit ones are read"),
])
def test_a_card_promising_a_checkpoint_pcg_does_not_read_as_declared_is_named(tmp_path, quantized, weights, words):
    card = _thinking_variant(tmp_path, quantized, **weights)
    (scheme,) = card.quantized
    why = card.checkpoint_reason(scheme)
    if words is None:
        assert why is None
    else:
        assert why.startswith(f"k2t.yaml: quantized.{scheme} names moonshotai/Kimi-K2-Thinking") and words in why, why


def test_a_checkpoint_config_vendored_beside_the_cards_is_checked_too(tmp_path):
    """A declared checkpoint other than the card's own hub id is checked against configs/<org>__<name>.json when
    the repository holds it (and left alone when it does not)."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "org__m-W4A16.json").write_text(json.dumps(
        load_cards()["kimi-k2-thinking"].config | {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    card = tmp_path / "m.yaml"
    card.write_text("id: m\nhub_id: org/m\narchitecture: X\nconfig: {model_type: qwen3}\n"
                    "quantized: {fp8_block: org/m-W4A16, int8_w8a8: org/m-W8A8}\n")
    c = _load(card)
    assert "reads as gptq, not fp8_block" in c.checkpoint_reason("fp8_block")
    assert c.checkpoint_config("int8_w8a8") is None and c.checkpoint_reason("int8_w8a8") is None


def test_the_precheck_turns_a_real_weights_cell_of_an_unreadable_declared_checkpoint_unsupported(tmp_path):
    """Before any download: a full cell of a checkpoint the card promises but pcg would not read as that scheme."""
    axes = {"model": "k2t:full", "quant": "gptq", "attention": "sdpa", "parallel": "tp1", "graph": "piecewise",
            "compiler": "eager"}
    cell = Cell(key="k", axes=axes, spec=CellSpec(model="k2t", quant="gptq", weights="real", device="cpu"), timeout_s=60)
    good = _thinking_variant(tmp_path, '{"gptq": "moonshotai/Kimi-K2-Thinking"}')
    assert precheck(cell, capabilities(), {"k2t": good}) is None
    bad = _thinking_variant(tmp_path, '{"gptq": "moonshotai/Kimi-K2-Thinking"}', group_size=16)
    assert "whose quantization_config pcg does not read" in precheck(cell, capabilities(), {"k2t": bad})
