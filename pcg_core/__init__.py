"""pcg_core: a piecewise CUDA-graph runtime for LLM prefill on transformers' own model implementations.

The names below are loaded on first use (PEP 562), so `import pcg_core.errors` or `from pcg_core.errors import
ConfigError` costs no torch, no transformers and no op registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcg_core.lazy import lazy_exports

if TYPE_CHECKING:
    from pcg_core.config import CaptureConfig, EngineConfig, default_bucket_ladder
    from pcg_core.engine import Engine, SequenceOutput
    from pcg_core.errors import ConfigError, UnsupportedModel
    from pcg_core.model import load_model

_EXPORTS = {
    "CaptureConfig": "pcg_core.config",
    "ConfigError": "pcg_core.errors",
    "Engine": "pcg_core.engine",
    "EngineConfig": "pcg_core.config",
    "SequenceOutput": "pcg_core.engine",
    "UnsupportedModel": "pcg_core.errors",
    "default_bucket_ladder": "pcg_core.config",
    "load_model": "pcg_core.model",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
