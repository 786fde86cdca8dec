"""A hub id on a machine that cannot reach the hub (and did not set HF_HUB_OFFLINE): answered from the local
cache at once, or one clear error, not ~30 s of retries printing a line each."""

from __future__ import annotations

import socket
import time

import pytest

from pcg_core.errors import ConfigError
from pcg_core.model import loader


def test_an_unreachable_hub_fails_fast_and_once(monkeypatch: pytest.MonkeyPatch, tmp_path, capfd) -> None:
    from huggingface_hub import constants

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    loader.hub_reachable.cache_clear()
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="not in the local cache and the hub cannot be reached"):
        loader.fetch_hub_file("org/never-downloaded", "config.json")
    assert time.perf_counter() - t < 5
    assert "Retrying" not in capfd.readouterr().err
    loader.hub_reachable.cache_clear()
