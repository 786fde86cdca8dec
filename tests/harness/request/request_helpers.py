"""Helpers the model-request tests share (imported as a plain module, like tests/pcg_core/pcg_helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cards import CARDS_DIR

REPO_CONFIGS = CARDS_DIR / "configs"


def load_config(name: str) -> dict:
    return json.loads((REPO_CONFIGS / name).read_text())


def cache_config(cache: Path, hub_id: str, config: dict, commit: str, refs: tuple[str, ...] = ("main",)) -> None:
    """Put config.json for `hub_id` at `commit` (40 hex digits) into a hub cache, laid out as huggingface_hub does."""
    repo = cache / f"models--{hub_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir()
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
