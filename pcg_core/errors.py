"""The core's error types, in a module that imports nothing, so callers that only catch or raise them (the store,
the reports, a dashboard) never pay for torch or transformers.

Messages name config fields and load_model arguments, never command-line flags: a CLI maps `field` to its flag.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: the message names the field and what is allowed.

    `field` is the config field or load_model argument the message is about (e.g. "backend", "layers"), or
    None when the fault lies in a file or a model rather than in one field.
    """

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class UnsupportedModel(ConfigError):
    """The runtime cannot run this model yet; the message says why."""
