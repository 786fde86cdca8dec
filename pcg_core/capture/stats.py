"""What a capture backend did: counted once at capture, then per forward."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class CaptureStats:
    backend: str = "disabled"
    pieces: int = 0  # captured pieces (piecewise) or segments (breakable) per bucket; 1 for full
    submodules: int = 0  # FX submodules after the split (piecewise: 2L+1)
    split_ops: int = 0  # split-op calls per forward
    graphed_split_ops: int = 0  # of those, recorded in graphs of their own (piecewise, capturable attention)
    graphs_captured: int = 0
    buckets: list[int] = field(default_factory=list)
    trace_s: float = 0.0  # dynamo trace + FX split
    compile_s: float = 0.0  # per-piece compile (eager compiler: ~0)
    capture_s: float = 0.0  # warm-up + capture of the whole ladder
    graph_pool_bytes: int = 0
    bucket_hits: Counter = field(default_factory=Counter)
    eager_fallbacks: int = 0  # batches above the largest bucket, run eagerly

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bucket_hits"] = {str(k): v for k, v in sorted(self.bucket_hits.items())}
        return d
