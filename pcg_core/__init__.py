"""pcg_core: a piecewise CUDA-graph runtime for LLM prefill on transformers' own model implementations."""

from pcg_core.config import CaptureConfig, ConfigError, EngineConfig, default_bucket_ladder
from pcg_core.engine import Engine, SequenceOutput
from pcg_core.model import load_model

__all__ = ["CaptureConfig", "ConfigError", "Engine", "EngineConfig", "SequenceOutput", "default_bucket_ladder", "load_model"]
