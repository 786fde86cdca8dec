"""Attention backends: a registry, so that new kernels plug in without touching the op or the capture code.

Registered like capture backends (`@register_attention_backend` reads `cls.name`, the getter returns the class).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import torch

from pcg_core.registry import ATTENTION_BACKENDS

if TYPE_CHECKING:
    from pcg_core.attention.kv_cache import KVCache
    from pcg_core.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: ClassVar[str] = ""
    # Can the whole op be recorded into a CUDA graph (static shapes, no host sync)? A capture backend that
    # declares requires_capturable_attention (full) needs it.
    capturable: ClassVar[bool] = False
    why_not_capturable: ClassVar[str] = ""

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
        md: AttentionMetadata,
        cache: KVCache,
    ) -> None: ...


def register_attention_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    return ATTENTION_BACKENDS.register(cls)


def attention_backend_names() -> list[str]:
    return ATTENTION_BACKENDS.names()


def get_attention_backend(name: str) -> type[AttentionBackend]:
    """The class registered as `name`; raises ConfigError (field "attention") naming the known ones."""
    return ATTENTION_BACKENDS.get(name)
