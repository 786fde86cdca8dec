"""Where a requested model's config.json comes from: a hub id, a local model directory or a config.json file.

Only config.json is fetched (huggingface_hub's hf_hub_download, so HF_HUB_OFFLINE and the local cache are
honoured); no weights, no tokenizer, and never remote code: the JSON is read as data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcg_core.errors import ConfigError
from pcg_core.model.loader import fetch_hub_file, read_config_file

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")


@dataclass
class ConfigSource:
    model: str  # the hub id, or the local path (resolved) the config was read from
    kind: str  # "hub" or "local"
    revision: str | None
    path: Path  # the config.json file actually read (for a hub id: its copy in the cache)
    config: dict[str, Any]

    @property
    def hub_id(self) -> str | None:
        return self.model if self.kind == "hub" else None


def looks_like_hub_id(text: str) -> bool:
    return bool(HUB_ID.match(text)) and not text.endswith(".json") and ".." not in text


def resolve(model: str, revision: str | None = None) -> ConfigSource:
    """Read MODEL's config.json; every failure is a ConfigError that names MODEL and the fix."""
    if not model or not model.strip():
        raise ConfigError("MODEL is empty; pass a hub id (org/name), a local model directory or a config.json path")
    path = Path(model).expanduser()
    if path.exists():
        if revision is not None:
            raise ConfigError(f"--revision {revision!r} applies to hub ids only; {model!r} is a local path (drop --revision)")
        config = read_config_file(path)
        file = path / "config.json" if path.is_dir() else path
        return ConfigSource(str(path.resolve()), "local", None, file.resolve(), config)
    if looks_like_hub_id(model):
        file = Path(fetch_hub_file(model, "config.json", revision=revision))
        return ConfigSource(model, "hub", revision, file, read_config_file(file))
    raise ConfigError(
        f"model {model!r}: no such file or directory, and not a hub id (org/name); pass a hub id such as "
        "Qwen/Qwen3-0.6B, a local model directory or a config.json path"
    )
