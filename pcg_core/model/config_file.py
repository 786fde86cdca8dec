"""Reading a config.json as data: the one reader the loader, the model cards and `pcgh request` share.

Standard library only, so what reads a config without running a model (`pcgh models`, `pcgh request`, the
matrix's cards) costs no torch and no transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pcg_core.errors import ConfigError


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"{p}: no config.json there; pass a model directory, a config.json file or a hub id")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")  # JSON is UTF-8 (RFC 8259); not the locale's encoding
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{p}: not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start} (line {line}); "
                          "a config.json is UTF-8 JSON") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e.msg} at line {e.lineno}); fix the file or pass another config") from e
    except (ValueError, RecursionError) as e:  # an integer of more digits than Python converts; absurd nesting
        raise ConfigError(f"{p}: a value cannot be read: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config.json must hold a JSON object, found {type(data).__name__}")
    return data
