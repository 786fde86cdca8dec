"""Models: transformers' modules with pcg's attention op and expert path swapped in."""

from pcg_core.model.architectures import SUPPORTED_ARCHITECTURES, architecture_of, check_supported, unsupported_reason
from pcg_core.model.loader import LoadedModel, build_config, load_model, read_config_file, shrink_config

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "LoadedModel",
    "architecture_of",
    "build_config",
    "check_supported",
    "load_model",
    "read_config_file",
    "shrink_config",
    "unsupported_reason",
]
