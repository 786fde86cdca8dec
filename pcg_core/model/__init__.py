"""Models: transformers' modules with pcg's attention op and expert path swapped in.

The names below are loaded on first use (PEP 562), as in the package root: the architecture table
(`architectures.py`) and the config reader (`config_file.py`) cost no torch and no transformers, so `pcgh
models` lists the cards without loading the runtime; `load_model` and `build_config` load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcg_core.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
