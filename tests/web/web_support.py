"""What the dashboard tests share besides fixtures: the upload token, the browser's settings, the CI rule."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TOKEN = "test-upload-token"
CHROMIUM = os.environ.get("PCG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def screenshot_path(name: str, tmp_path: Path) -> Path:
    """docs/screenshots/NAME with PCG_UPDATE_SCREENSHOTS=1; otherwise a temporary file, so a test run does not
    rewrite the committed images (the stale-nightly banner's day count changes from day to day)."""
    folder = SCREENSHOTS if os.environ.get("PCG_UPDATE_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(message: str) -> None:
    """Skip locally; under CI a missing service means .ci/run is broken, so fail."""
    if in_ci():
        pytest.fail(f"{message}, and CI is set: .ci/run must install it")
    pytest.skip(message)


@dataclass
class Tab:
    """A browser page on the live server, with every request URL and dialog it saw."""

    page: Any
    base: str
    requests: list[str]
    dialogs: list[str]

    def goto(self, path: str) -> Any:
        return self.page.goto(self.base + path)
