"""Attention backends: a registry, so that new kernels plug in without touching the op or the capture code."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pcg_core.attention.metadata import AttentionMetadata
    from pcg_core.engine.kv_cache import KVCache


class AttentionBackend(ABC):
    name: str = ""
    # Can the whole op be recorded into a CUDA graph (static shapes, no host sync)? `full` capture needs it.
    capturable: bool = False
    why_not_capturable: str = ""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        out: torch.Tensor,  # [T, H, D], written in place
        layer: int,
        scale: float,
        sliding_window: int,
        md: "AttentionMetadata",
        cache: "KVCache",
    ) -> None: ...


_BACKENDS: dict[str, type[AttentionBackend]] = {}


def register_attention_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    _BACKENDS[cls.name] = cls
    return cls


def attention_backend_names() -> list[str]:
    return sorted(_BACKENDS)


def get_attention_backend(name: str) -> AttentionBackend:
    from pcg_core.config import ConfigError

    if name not in _BACKENDS:
        raise ConfigError(f"attention backend {name!r} is unknown; choose one of {', '.join(attention_backend_names())}")
    return _BACKENDS[name]()
