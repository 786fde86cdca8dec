"""One cell of the matrix: an eager reference and a graph candidate on the same weights, run over the prompt
suite and judged, with latency side by side.

- spec.py — CellSpec, the cell's run settings (what the worker reads on stdin)
- run.py — run_cell and its phases: load, eager reference, candidate, judge, latency → a CellOutcome; the phases
  call the judge's policy
- prompts.py — the prompt suite, derived from the bucket ladder, and the latency token counts
- coverage.py — what the suite made the graph candidate run (buckets, layouts, decode steps), counted per forward
- judge/ — the judge, in a room of its own (judge/__init__.py maps it): policy.py composes and numbers its layers
  (1 eager against itself, 2 the graph runs, 3 lockstep KL and same-padding, 4 tokens and logprobs against unpadded
  eager, 5 first diverging piece, 6 reference layer, 7 parallel: parallel.py's tp1_check); tolerances, the token
  rule, the lockstep, the padding check and the reference layer beside it
- parallel.py — a parallel cell's process group, and layer 7: its eager against the same weights unsharded
- crash.py, memory.py — a crash's status and reason; the graphs' memory against the KV cache
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
