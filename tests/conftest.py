"""Shared test fixtures. Markers `gpu` and `slow` are declared in pyproject.toml; nothing global is set here."""

from __future__ import annotations

from pathlib import Path

import pytest

# Real config.json files of the seed models (the model cards' configs, shipped with the package).
# Load them with `load_model(CONFIGS / name, tiny=True)`.
CONFIGS = Path(__file__).resolve().parents[1] / "harness" / "models" / "configs"


@pytest.fixture(scope="session")
def configs() -> Path:
    """The folder of real model configs the tests load from."""
    assert CONFIGS.is_dir(), f"{CONFIGS} is missing"
    return CONFIGS
