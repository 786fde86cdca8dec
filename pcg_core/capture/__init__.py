"""Capture backends: `disabled`, `piecewise`, `breakable`, `full`; one config chooses, a registry holds them.

Importing this package imports every built-in backend, and each registers itself with `@register_capture_backend`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pcg_core.capture.base import Body, CaptureBackend, DisabledBackend, GraphBackend, MakeInputs
from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.full import FullBackend
from pcg_core.capture.piecewise import PiecewiseBackend
from pcg_core.capture.registry import capture_backend_names, get_capture_backend, register_capture_backend
from pcg_core.capture.stats import CaptureStats
from pcg_core.config import CaptureConfig
from pcg_core.split_ops import register_split_op, split_op_names

if TYPE_CHECKING:
    from pcg_core.attention.backend import AttentionBackend


def make_capture_backend(config: CaptureConfig, body: Body, device: torch.device, make_inputs: MakeInputs,
                         attn_backend: AttentionBackend) -> CaptureBackend:
    return get_capture_backend(config.backend)(body, config, device, make_inputs, attn_backend=attn_backend)


__all__ = [
    "BreakableBackend",
    "CaptureBackend",
    "CaptureStats",
    "DisabledBackend",
    "FullBackend",
    "GraphBackend",
    "PiecewiseBackend",
    "capture_backend_names",
    "get_capture_backend",
    "make_capture_backend",
    "register_capture_backend",
    "register_split_op",
    "split_op_names",
]
