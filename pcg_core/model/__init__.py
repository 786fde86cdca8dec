"""Models: transformers' modules with pcg's attention op and expert path swapped in.

The names below are loaded on first use (PEP 562), as in the package root: the architecture table
(`architectures.py`) and the config reader (`config_file.py`) cost no torch and no transformers, so `pcgh
models` lists the cards without loading the runtime; `load_model` and `build_config` load it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pcg_core.model.architectures import SUPPORTED_ARCHITECTURES, architecture_of, check_supported, unsupported_reason
    from pcg_core.model.config_file import read_config_file
    from pcg_core.model.loader import LoadedModel, build_config, load_model, shrink_config

_EXPORTS = {
    "SUPPORTED_ARCHITECTURES": "pcg_core.model.architectures",
    "LoadedModel": "pcg_core.model.loader",
    "architecture_of": "pcg_core.model.architectures",
    "build_config": "pcg_core.model.loader",
    "check_supported": "pcg_core.model.architectures",
    "load_model": "pcg_core.model.loader",
    "read_config_file": "pcg_core.model.config_file",
    "shrink_config": "pcg_core.model.loader",
    "unsupported_reason": "pcg_core.model.architectures",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pcg_core.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
