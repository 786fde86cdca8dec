"""A capture backend for the `pcgh nightly` tests, loaded through PCG_PLUGINS: `nightly_probe` is piecewise, with a
fault that $PCG_NIGHTLY_PLANT turns on — "regress": every replay's output 1% off; "flaky": the same, in the first
worker process only (counted in $PCG_NIGHTLY_DIR), so the runner's retry passes; anything else: no fault."""

from __future__ import annotations

import os
from pathlib import Path

from pcg_core.capture.piecewise import PiecewiseBackend
from pcg_core.capture.registry import register_capture_backend


def _fires() -> bool:
    plant = os.environ.get("PCG_NIGHTLY_PLANT", "")
    if plant == "regress":
        return True
    if plant != "flaky":
        return False
    counter = Path(os.environ["PCG_NIGHTLY_DIR"]) / "processes"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    return n == 0


class NightlyProbe(PiecewiseBackend):
    name = "nightly_probe"

    def prepare(self) -> None:
        super().prepare()
        self._fault = _fires()

    def run(self, input_ids, positions, ctx):
        out = super().run(input_ids, positions, ctx)
        return out * 1.01 if self._fault else out


register_capture_backend(NightlyProbe)
