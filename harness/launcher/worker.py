"""A cell's own process: reads a CellSpec (JSON) on stdin, runs it, writes its CellOutcome (JSON) to argv[1].

Phase markers go to stderr so that the parent can classify a death without a result (segfault, OOM kill).
The worker leads a process group of its own and never outlives its runner (watch.py). Nothing imports this module:
it is `python -m harness.launcher.worker` (or forked from a zygote and run as __main__ there).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.launcher.watch import phase_marks, watch_parent

if TYPE_CHECKING:
    from harness.cell import CellSpec
    from harness.outcome import CellOutcome


def _other_engine(spec: CellSpec) -> CellOutcome:
    """An SGLang cell: its two servers on the GPUs this worker holds, their logs after the verdict in this log."""
    import tempfile

    from harness.sglang.cell import run_sglang_cell

    with tempfile.TemporaryDirectory(prefix="pcg-sglang-") as work:
        try:
            return run_sglang_cell(spec, Path(work))
        finally:
            for log in sorted(Path(work).glob("*.log")):
                print(f"--- {log.name} (its last 20,000 characters) ---\n{log.read_text(errors='replace')[-20_000:]}",
                      flush=True)


def main() -> int:
    watch_parent()  # started already, as the package was imported (harness/launcher/__init__.py); this one is a no-op
    from harness.cell import CellSpec, run_cell
    from harness.outcome import CellOutcome, Status
    from pcg_core.errors import ConfigError
    from pcg_core.plugins import load_plugins

    out = Path(sys.argv[1])
    spec = CellSpec(**json.load(sys.stdin))

    try:
        load_plugins()
        outcome = run_cell(spec, on_phase=phase_marks()) if spec.engine == "pcg" else _other_engine(spec)
    except ConfigError as e:
        outcome = CellOutcome(status=Status.FAIL_RUN, reason=f"bad input: {e}")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(outcome.to_json())
    os.replace(tmp, out)  # the parent sees a whole result or none
    from pcg_core.distributed import shutdown

    shutdown()  # a rank of a parallel cell: its process group torn down before the interpreter's exit (NCCL warns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
