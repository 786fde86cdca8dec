"""The capture-backend registry, so new backends (and test-only fault injectors) plug in by name.

`@register_capture_backend` reads `cls.name`, as `@register_attention_backend` does; the getter returns the class.
The registry itself lives in `pcg_core.registry`, below the config that checks names against it.
"""

from __future__ import annotations

from typing import TypeVar

from pcg_core.registry import CAPTURE_BACKENDS

T = TypeVar("T", bound=type)


def register_capture_backend(cls: T) -> T:
    return CAPTURE_BACKENDS.register(cls)


def capture_backend_names() -> list[str]:
    return CAPTURE_BACKENDS.names()


def get_capture_backend(name: str) -> type:
    """The class registered as `name`; raises ConfigError (field "backend") naming the known ones."""
    return CAPTURE_BACKENDS.get(name)
