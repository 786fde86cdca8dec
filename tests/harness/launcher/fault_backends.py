"""Test-only capture backends that misbehave on purpose, loaded into cell workers through PCG_PLUGINS.

Each shows that the judge and the launcher give the right status and that other cells' results survive.
"""

from __future__ import annotations

import os
import signal
import sys
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



def _hang_with_a_child() -> None:
    """Start a child (in the worker's process group), write its pid to PCG_TEST_FLAKY_DIR/child.pid, hang."""
    import subprocess

    child = subprocess.Popen(["sleep", "3600"])
    (Path(os.environ["PCG_TEST_FLAKY_DIR"]) / "child.pid").write_text(str(child.pid))
    time.sleep(3600)


# Graph names whose worker misbehaves as a phase starts (see _plant_in_phases): test_kill_<phase> dies by
# SIGKILL, a death no `except` sees (an OOM killer, a lost GPU); test_hang_<phase> hangs with a child of its own.
_PLANTED = {"test_kill_load": "load", "test_kill_eager": "eager", "test_hang_load": "load"}
for _graph in _PLANTED:
    register_capture_backend(type(f"Planted_{_graph}", (PiecewiseBackend,), {"name": _graph}))


def _plant_in_phases() -> None:
    """In a cell worker: wrap the load and eager phases of run_cell so that the planted graphs misbehave there."""
    import harness.cell.run as run

    for phase, fn in (("load", "_load"), ("eager", "_eager_reference")):
        def hooked(cell, *args, _phase=phase, _original=getattr(run, fn)):
            if _PLANTED.get(cell.spec.graph) == _phase:
                if cell.spec.graph.startswith("test_kill_"):
                    os.kill(os.getpid(), signal.SIGKILL)
                _hang_with_a_child()
            return _original(cell, *args)

        setattr(run, fn, hooked)


if getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) == "harness.launcher.worker":
    _plant_in_phases()  # only in a worker: the test process that imports this module runs no cell
