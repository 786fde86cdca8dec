"""Configuration objects: which capture backend, which buckets, which attention backend.

One `CaptureConfig` chooses everything about graphs; `EngineConfig` adds device, dtype and KV-cache size.
Validation happens here so that bad values fail early with a message naming the field and the fix (the
ConfigError's `field`); capture backend names are checked against the registry, which sits below this module.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from pcg_core.errors import ConfigError
from pcg_core.known import COMPILERS, DTYPE_NAMES, KV_CACHE_DTYPES, MAX_TOKENS
from pcg_core.registry import CAPTURE_BACKENDS

__all__ = ["COMPILERS", "DTYPES", "KV_CACHE_DTYPES", "CaptureConfig", "EngineConfig", "default_bucket_ladder"]

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def default_bucket_ladder(max_tokens: int = 4096) -> list[int]:
    """4–32 step 4, 48–256 step 16, 288–512 step 32, 576–1024 step 64, 1280–4096 step 256, cut at max_tokens.

    Fine steps where padding waste is a large fraction of the batch, coarse ones where it is not.
    """
    ladder = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
    )
    cut = [b for b in ladder if b <= max_tokens]
    if max_tokens not in cut and max_tokens > 0:
        cut.append(max_tokens)  # the max itself is always a bucket, so "≤ max" never falls back
    return cut


@dataclass
class CaptureConfig:
    """What the graph candidate does: `disabled` (eager), `piecewise`, `breakable` or `full`."""

    backend: str = "disabled"
    compiler: str = "eager"
    max_tokens: int = 4096
    buckets: list[int] | None = None  # explicit list; overrides the default ladder
    # piecewise: record a capturable attention op in a graph of its own per bucket (between the pieces' graphs)
    # instead of running it eagerly; False keeps every split op eager, as the breakable backend does.
    graph_attention: bool = True

    def __post_init__(self) -> None:
        CAPTURE_BACKENDS.check(self.backend)  # raises ConfigError naming the known backends
        if self.compiler not in COMPILERS:
            raise ConfigError(f"compiler {self.compiler!r} is unknown; choose one of {', '.join(COMPILERS)}", field="compiler")
        if self.buckets is not None:
            bad = [b for b in self.buckets if not isinstance(b, int) or b <= 0]
            if bad or not self.buckets:
                raise ConfigError(f"buckets must be a non-empty list of positive integers, got {self.buckets!r}", field="buckets")
            self.buckets = sorted(set(self.buckets))
            self.max_tokens = self.buckets[-1]
        elif not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise ConfigError(f"max_tokens must be a positive integer, got {self.max_tokens!r}", field="max_tokens")
        if self.max_tokens > MAX_TOKENS:
            raise ConfigError(f"max_tokens {self.max_tokens} is past the largest bucket the runtime captures "
                              f"({MAX_TOKENS}); give a smaller one", field="max_tokens")

    @property
    def ladder(self) -> list[int]:
        return list(self.buckets) if self.buckets is not None else default_bucket_ladder(self.max_tokens)

    def bucket_for(self, num_tokens: int) -> int | None:
        """Smallest bucket ≥ num_tokens, or None above the largest (that batch runs eagerly)."""
        ladder = self.ladder
        i = bisect.bisect_left(ladder, num_tokens)
        return ladder[i] if i < len(ladder) else None


@dataclass
class EngineConfig:
    """What the engine runs on: device, dtype, attention backend (checked when the Engine is built), KV cache."""

    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "sdpa"
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    kv_slots: int = 8192  # KV-cache capacity in tokens, shared by all sequences of a batch (whole pages)
    page_size: int | None = None  # KV slots per page; None: the attention backend's own (flex 128)
    # What the KV cache stores: "auto" the model's dtype; "fp8_e4m3" FP8 with per-layer K and V scales, read from
    # the model's `pcg_kv_scales` (a checkpoint's, or calibrated: pcg_core.engine.kv_scales).
    kv_cache: str = "auto"
    # Live sequences the linear-attention state pool holds (models with linear_attention layers only: Qwen3-Next).
    linear_state_slots: int = 32

    def __post_init__(self) -> None:
        if self.kv_cache not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache {self.kv_cache!r} is unknown; choose one of {', '.join(KV_CACHE_DTYPES)}",
                              field="kv_cache")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is unknown; choose one of {', '.join(DTYPES)}", field="dtype")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device {self.device!r} is unknown; use cpu or cuda", field="device")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device {self.device!r} was asked for but torch sees no CUDA GPU; use device 'cpu'", field="device")
        if self.kv_slots <= 0:
            raise ConfigError(f"kv_slots must be positive, got {self.kv_slots}", field="kv_slots")
        if self.page_size is not None and (not isinstance(self.page_size, int) or isinstance(self.page_size, bool)
                                           or self.page_size < 1):
            raise ConfigError(f"page_size must be a positive integer (or unset), got {self.page_size!r}", field="page_size")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)
