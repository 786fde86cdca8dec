"""config.json is read as UTF-8 JSON whatever the locale: bad bytes or unreadable values are one ConfigError line."""

from __future__ import annotations

import pytest

from pcg_core.errors import ConfigError
from pcg_core.model import load_model, read_config_file


def test_non_utf8_config_json_names_the_file_and_the_byte(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "qwen3",\n "name": "\xff"}')
    with pytest.raises(ConfigError) as e:
        read_config_file(tmp_path)
    assert str(e.value).startswith(f"{path}: not UTF-8 text: byte 0xff at offset 34 (line 2)")
    with pytest.raises(ConfigError, match="not UTF-8"):  # the path `pcgh cell --model DIR` takes
        load_model(str(tmp_path), weights="synthetic")


def test_utf8_config_json_reads_under_any_locale(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_bytes('{"model_type": "qwen3", "name": "café"}'.encode())
    monkeypatch.setenv("LC_ALL", "C")  # read_text() would follow the locale; read_config_file does not
    assert read_config_file(path)["name"] == "café"


@pytest.mark.parametrize("text", ['{"n": ' + "9" * 5000 + "}", "[" * 100_000 + "]" * 100_000])
def test_unreadable_values_are_config_errors(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="config.json"):
        read_config_file(path)
