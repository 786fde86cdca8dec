"""The words every harness module shares: the matrix axes and the statuses' meaning for pass rates."""

from __future__ import annotations

from harness.judge import PASSING, STATUSES

# A cell is one point of these axes. `model` is "card_id:variant" (variant: full, trim:N, tiny).
AXES = ("model", "quant", "attention", "parallel", "graph", "compiler")

# Shown, but not counted against the pass rate.
NOT_COUNTED = ("eager_fail", "unsupported", "skipped")

__all__ = ["AXES", "NOT_COUNTED", "PASSING", "STATUSES"]
