"""Test-only capture backends that misbehave on purpose, loaded into cell workers through PCG_PLUGINS.

Each shows that the judge and the launcher give the right status and that other cells' results survive.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.piecewise import PiecewiseBackend
from pcg_core.capture.registry import register_capture_backend


@register_capture_backend
class PerturbAfterReplay(PiecewiseBackend):
    """Replays correctly, then adds a small error to the hidden states (a silent accuracy bug)."""

    name = "test_perturb"

    def run(self, input_ids, positions, ctx):
        out = super().run(input_ids, positions, ctx)
        return out + 0.05 * out.abs().mean()


@register_capture_backend
class PerturbOnePiece(PiecewiseBackend):
    """Piece 1 computes a slightly wrong result on the graph path (replay or split-graph run), not in eager."""

    name = "test_perturb_piece"

    def _on_graph(self, gm, example_inputs):
        split_gm = super()._on_graph(gm, example_inputs)
        runner = [m for m in split_gm.children() if hasattr(m, "index") and m.index == 1][0]
        inner = runner.fn

        def wrong(*args):
            out = inner(*args)
            return tuple(o * 1.01 if hasattr(o, "dtype") and o.dtype.is_floating_point else o for o in out) \
                if isinstance(out, tuple) else out * 1.01

        del runner.fn  # a registered submodule; replace it with a plain function
        runner.fn = wrong
        return split_gm


@register_capture_backend
class RaiseDuringCapture(BreakableBackend):
    name = "test_raise_capture"

    def prepare(self) -> None:
        raise RuntimeError("planted failure during capture")


@register_capture_backend
class SegfaultDuringCapture(BreakableBackend):
    name = "test_segfault"

    def prepare(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)


@register_capture_backend
class HangDuringCapture(BreakableBackend):
    name = "test_hang"

    def prepare(self) -> None:
        time.sleep(3600)


@register_capture_backend
class FailOnceThenWork(BreakableBackend):
    """Fails the first capture in a directory (PCG_TEST_FLAKY_DIR), works the next time: pass_flaky."""

    name = "test_flaky"

    def prepare(self) -> None:
        marker = Path(os.environ["PCG_TEST_FLAKY_DIR"]) / "failed-once"
        if not marker.exists():
            marker.write_text("x")
            raise RuntimeError("planted one-off failure")
        super().prepare()
