"""Planted faults for the `pcgh nightly` tests, loaded through PCG_PLUGINS (a plugin may replace a built-in
backend): `piecewise` and `disabled` (eager) replaced by versions whose fault $PCG_NIGHTLY_PLANT turns on —
"regress": every piecewise replay's output 1% off; "flaky": the same, in the first worker process only (counted in
$PCG_NIGHTLY_DIR), so the runner's retry passes; "eager_noise": each eager forward sleeps a random 0-20 ms, so eager
timings (and the speedups over eager) swing while the graph's do not; anything else: no fault. The cell key stays
the smoke matrix's own from night to night, as a real regression's does."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from pcg_core.capture.base import DisabledBackend
from pcg_core.capture.piecewise import PiecewiseBackend
from pcg_core.capture.registry import register_capture_backend


def _plant() -> str:
    return os.environ.get("PCG_NIGHTLY_PLANT", "")


def _fires() -> bool:
    if _plant() == "regress":
        return True
    if _plant() != "flaky":
        return False
    counter = Path(os.environ["PCG_NIGHTLY_DIR"]) / "processes"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    return n == 0


class PlantedPiecewise(PiecewiseBackend):
    name = "piecewise"

    def prepare(self) -> None:
        super().prepare()
        self._fault = _fires()

    def run(self, input_ids, positions, ctx):
        out = super().run(input_ids, positions, ctx)
        return out * 1.01 if self._fault else out


class NoisyEager(DisabledBackend):
    name = "disabled"

    def run(self, input_ids, positions, ctx):
        if _plant() == "eager_noise":
            time.sleep(random.uniform(0.0, 0.02))
        return super().run(input_ids, positions, ctx)


register_capture_backend(PlantedPiecewise)
register_capture_backend(NoisyEager)
