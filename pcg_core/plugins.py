"""Plugins: modules named in PCG_PLUGINS (comma-separated) are imported at start-up, so that out-of-tree
capture backends, attention backends or split ops register themselves — in the CLI and in every cell worker."""

from __future__ import annotations

import importlib
import os

from pcg_core.errors import ConfigError


def load_plugins() -> list[str]:
    names = [n.strip() for n in os.environ.get("PCG_PLUGINS", "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"PCG_PLUGINS names {name!r}, which cannot be imported: {e}") from e
    return names
