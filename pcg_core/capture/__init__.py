"""Capture backends: `disabled`, `piecewise`, `breakable`, `full`; one config chooses, a registry holds them."""

from __future__ import annotations

import torch

from pcg_core.capture.base import Body, CaptureBackend, MakeInputs
from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.full import FullBackend
from pcg_core.capture.piecewise import PiecewiseBackend
from pcg_core.capture.registry import capture_backend_names, get_capture_backend, register_capture_backend
from pcg_core.capture.split_ops import register_split_op, split_op_names
from pcg_core.capture.stats import CaptureStats
from pcg_core.config import CaptureConfig

for _cls in (CaptureBackend, PiecewiseBackend, BreakableBackend, FullBackend):
    register_capture_backend(_cls.name)(_cls)


def make_capture_backend(config: CaptureConfig, body: Body, device: torch.device, make_inputs: MakeInputs, attn_backend) -> CaptureBackend:
    return get_capture_backend(config.backend)(body, config, device, make_inputs, attn_backend=attn_backend)


__all__ = [
    "CaptureBackend",
    "CaptureStats",
    "capture_backend_names",
    "make_capture_backend",
    "register_capture_backend",
    "register_split_op",
    "split_op_names",
]
