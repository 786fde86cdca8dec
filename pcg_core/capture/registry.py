"""The registry of capture backends, so new ones (and test-only fault injectors) plug in by name."""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")
_BACKENDS: dict[str, type] = {}


def register_capture_backend(name: str) -> Callable[[T], T]:
    def deco(cls: T) -> T:
        cls.name = name  # type: ignore[attr-defined]
        _BACKENDS[name] = cls  # type: ignore[assignment]
        return cls

    return deco


def capture_backend_names() -> list[str]:
    import pcg_core.capture  # noqa: F401  (registers the built-in backends)

    return list(_BACKENDS)


def get_capture_backend(name: str) -> type:
    from pcg_core.config import ConfigError

    if name not in capture_backend_names():
        raise ConfigError(f"capture backend {name!r} is unknown; choose one of {', '.join(capture_backend_names())}")
    return _BACKENDS[name]
