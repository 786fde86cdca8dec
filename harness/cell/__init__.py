"""One cell of the matrix: an eager reference and a graph candidate on the same weights, run over the prompt
suite and judged, with latency side by side.

- spec.py — CellSpec, the cell's run settings (what the worker reads on stdin)
- run.py — run_cell and its phases: load, eager reference, candidate, judge, latency → a CellOutcome
- prompts.py — the prompt suite, derived from the bucket ladder, and the latency token counts
- coverage.py — what the suite made the graph candidate run (buckets, layouts, decode steps), counted per forward
- judge.py — tolerances, the near-tie noise bound and the token/logprob comparison (judge layers 1, 3 and 4)
- diagnose.py — the layers that need both engines, run in lockstep on their own KV caches: KL at prompt and
  decode positions, and the first diverging piece (layer 5)
- timing.py — medians of CUDA-event (or wall-clock) timings

The package root is lazy (PEP 562): `harness.cell.timing` or `.prompts` alone (the benchmarks on the GPU image)
import no pydantic, no model cards.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.cell.run import run_cell
    from harness.cell.spec import resolve_model
    from harness.cell.spec import CellSpec

_WHERE = {"CellSpec": "harness.cell.spec", "resolve_model": "harness.cell.spec", "run_cell": "harness.cell.run"}
__all__ = ["CellSpec", "resolve_model", "run_cell"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'harness.cell' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
