"""Model cards: every shipped card loads; a broken config beside a card is named in the error."""

import pytest

from harness.cards import _load, load_cards
from pcg_core.errors import ConfigError


def test_shipped_cards_load_with_their_configs():
    cards = load_cards()
    assert {"qwen3-0.6b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "kimi-k2", "grok-2"} <= set(cards)
    assert all(card.config.get("model_type") for card in cards.values())


def test_the_torch_free_architecture_verdict_agrees_with_the_full_one_on_every_shipped_card():
    """`pcgh models` shows architecture_reason (the table alone, no torch); the pre-check runs runtime_reason
    (transformers builds the config too). On the shipped cards they must say the same."""
    cards = load_cards()
    assert {c.id: c.architecture_reason for c in cards.values()} == {c.id: c.runtime_reason for c in cards.values()}
    assert cards["qwen3-0.6b"].architecture_reason is None
    assert "Qwen3NextForCausalLM is not supported yet" in cards["qwen3-next-80b-a3b"].architecture_reason


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
