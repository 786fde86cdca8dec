"""Reading a raw config.json: the language-model part of it, and typed fields that fail with the field's name.

The request command never builds the model and never runs remote code: every number comes from the JSON as
published. VLM configs keep the language model's widths under `text_config` (Qwen-VL, Gemma 3, Llava …);
`lm_fields` merges them over the top level so the rest of the code reads one flat mapping.
"""

from __future__ import annotations

from typing import Any

from pcg_core.errors import ConfigError

# Where multimodal configs put the language model's fields, in the order they are looked for.
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
VISION_CONFIG_KEYS = ("vision_config",)


def lm_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: the top level, overridden by a nested text config if there is one."""
    for key in TEXT_CONFIG_KEYS:
        nested = config.get(key)
        if isinstance(nested, dict):
            return {**config, **nested}
    return dict(config)


def vision_fields(config: dict[str, Any]) -> dict[str, Any] | None:
    for key in VISION_CONFIG_KEYS:
        nested = config.get(key)
        if isinstance(nested, dict):
            return nested
    return None


class Fields:
    """Typed access to one mapping of config fields; a wrong type is a ConfigError naming the field and the fix."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def opt_int(self, key: str, default: int | None = None, *, minimum: int = 0) -> int | None:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{self.where}: field {key} must be an integer, got {value!r}; fix the config.json")
        if value < minimum:
            raise ConfigError(f"{self.where}: field {key} must be ≥ {minimum}, got {value!r}; fix the config.json")
        return int(value)

    def get_int(self, key: str, default: int, *, minimum: int = 0) -> int:
        """The field, or `default` when absent or null."""
        value = self.opt_int(key, minimum=minimum)
        return default if value is None else value

    def first_int(self, keys: tuple[str, ...], default: int | None = None, *, minimum: int = 0) -> int | None:
        for key in keys:
            value = self.opt_int(key, minimum=minimum)
            if value is not None:
                return value
        return default

    def opt_str(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(f"{self.where}: field {key} must be a string, got {value!r}; fix the config.json")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key)
        return default if value is None else bool(value)

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{self.where}: field {key} must be a list of integers, got {value!r}; fix the config.json")
        return list(value)

    def str_list(self, key: str) -> list[str]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.where}: field {key} must be a list of strings, got {value!r}; fix the config.json")
        return list(value)
