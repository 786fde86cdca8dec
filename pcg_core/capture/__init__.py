"""Capture backends: `disabled`, `piecewise`, `breakable`, `full`; one config chooses."""

from __future__ import annotations

import torch

from pcg_core.capture.base import Body, CaptureBackend, MakeInputs
from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.full import FullBackend
from pcg_core.capture.piecewise import PiecewiseBackend
from pcg_core.capture.split_ops import register_split_op, split_op_names
from pcg_core.capture.stats import CaptureStats
from pcg_core.config import CaptureConfig

BACKENDS: dict[str, type[CaptureBackend]] = {
    "disabled": CaptureBackend,
    "piecewise": PiecewiseBackend,
    "breakable": BreakableBackend,
    "full": FullBackend,
}


def make_capture_backend(config: CaptureConfig, body: Body, device: torch.device, make_inputs: MakeInputs, attn_backend) -> CaptureBackend:
    cls = BACKENDS[config.backend]
    if cls is FullBackend:
        return FullBackend(body, config, device, make_inputs, attn_backend=attn_backend)
    return cls(body, config, device, make_inputs)


__all__ = ["BACKENDS", "CaptureBackend", "CaptureStats", "make_capture_backend", "register_split_op", "split_op_names"]
