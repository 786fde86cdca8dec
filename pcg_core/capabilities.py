"""What this runtime, on this machine, can run: the table the harness pre-checks cells against.

The harness keeps no list of its own, so when the runtime grows (an architecture, a quantization scheme, an
attention backend, a parallel mode) the matrix grows with it.
"""

from __future__ import annotations

from typing import Any

import torch

from pcg_core.attention.backend import attention_backend_names, get_attention_backend
from pcg_core.capture.registry import capture_backend_names
from pcg_core.config import COMPILERS, DTYPES
from pcg_core.model.architectures import SUPPORTED_ARCHITECTURES

QUANTIZATION = ("none",)  # schemes the runtime can execute; FP8/INT8/AWQ/GPTQ… come later
PARALLEL = {"tp1": 1}  # parallel mode → GPUs it needs; TP/EP/PP/DP come later


def capabilities() -> dict[str, Any]:
    attn = {}
    for name in attention_backend_names():
        b = get_attention_backend(name)
        attn[name] = {"capturable": b.capturable, "why_not_capturable": b.why_not_capturable}
    return {
        "architectures": {k: list(v) for k, v in SUPPORTED_ARCHITECTURES.items()},
        "attention_backends": attn,
        "capture_backends": capture_backend_names(),
        "compilers": list(COMPILERS),
        "dtypes": list(DTYPES),
        "quantization": list(QUANTIZATION),
        "parallel": dict(PARALLEL),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
