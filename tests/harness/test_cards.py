"""Model cards: every shipped card loads; a broken config beside a card is named in the error."""

import pytest

from harness.cards import _load, load_cards
from pcg_core.errors import ConfigError


def test_shipped_cards_load_with_their_configs():
    cards = load_cards()
    assert {"qwen3-0.6b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "kimi-k2", "grok-2"} <= set(cards)
    assert all(card.config.get("model_type") for card in cards.values())


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
