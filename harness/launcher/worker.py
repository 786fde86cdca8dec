"""A cell's own process: reads a CellSpec (JSON) on stdin, runs it, writes its CellOutcome (JSON) to argv[1].

Phase markers go to stderr so that the parent can classify a death without a result (segfault, OOM kill).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PHASE_MARK = "PCG-PHASE"


def main() -> int:
    from harness.cell import CellSpec, run_cell
    from harness.outcome import CellOutcome, Status
    from pcg_core.errors import ConfigError
    from pcg_core.plugins import load_plugins

    out = Path(sys.argv[1])
    spec = CellSpec(**json.load(sys.stdin))

    def phase(name: str) -> None:
        print(f"{PHASE_MARK} {name}", file=sys.stderr, flush=True)

    try:
        load_plugins()
        outcome = run_cell(spec, on_phase=phase)
    except ConfigError as e:
        outcome = CellOutcome(status=Status.FAIL_RUN, reason=f"bad input: {e}")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(outcome.to_json())
    os.replace(tmp, out)  # the parent sees a whole result or none
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
