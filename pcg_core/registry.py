"""Registries of pluggable backends: capture backends and attention backends, registered the same way.

A backend class is registered with a decorator that reads its `name`; lookups return the class and list names
in registration order. The module imports only the error types, so the config can check a name at the bottom
of the house. That is also why the built-in capture backends' names are declared here: a `CaptureConfig` is
checked before (and without) importing the torch code that implements them; each built-in class registers
itself under its declared name when its module is imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from pcg_core.errors import ConfigError

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    def __init__(self, kind: str, field: str, built_in: tuple[str, ...] = ()):
        self.kind = kind  # "capture backend", words for messages
        self.field = field  # the config field that names a member
        self.built_in = built_in
        self._classes: dict[str, T] = {}

    def register(self, cls: T) -> T:
        """Class decorator: registers `cls` under `cls.name` (a plugin may replace a built-in)."""
        name = getattr(cls, "name", "")
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls.__name__} needs a non-empty class attribute `name` to be registered as a {self.kind}")
        self._classes[name] = cls
        return cls

    def names(self) -> list[str]:
        """Built-in names first (in declared order), then the others in registration order."""
        return [*self.built_in, *(n for n in self._classes if n not in self.built_in)]

    def check(self, name: str) -> None:
        if name not in self.names():
            raise ConfigError(f"{self.kind} {name!r} is unknown; choose one of {', '.join(self.names())}", field=self.field)

    def get(self, name: str) -> T:
        self.check(name)
        if name not in self._classes:
            raise RuntimeError(f"{self.kind} {name!r} is built in but its module was not imported; import its package first")
        return self._classes[name]

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, class) of every registered member, in `names()` order."""
        return ((n, self._classes[n]) for n in self.names() if n in self._classes)


CAPTURE_BACKENDS: Registry = Registry("capture backend", field="backend", built_in=("disabled", "piecewise", "breakable", "full"))
ATTENTION_BACKENDS: Registry = Registry("attention backend", field="attention", built_in=("sdpa", "flex", "varlen"))
