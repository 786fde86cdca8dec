"""The cells of a gpu_cells.sh folder (`<i>.json`, one `pcgh cell --json` outcome each) to run again alone: those that
ran out of memory, and those that crashed while the device had under `free_gib` GiB free (the reason's note from
harness/cell/crash.py): cells side by side on one GPU fail so when together they fill it. Prints their list indices,
one a line, in order.

    python3 benchmarks/cells_retry.py OUT/NAME [FREE_GIB]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOM = re.compile(r"\[device memory free at the crash: ([0-9.]+) of [0-9.]+ GiB\]")


def retry(folder: Path, free_gib: float = 2.0) -> list[int]:
    out = []
    for path in folder.glob("*.json"):
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError):  # a cell killed before it wrote its outcome: nothing says it was memory
            continue
        room = ROOM.search(obj.get("reason") or "")
        if obj.get("status") == "oom" or (room is not None and float(room.group(1)) < free_gib):
            out.append(int(path.stem))
    return sorted(out)


if __name__ == "__main__":
    print("\n".join(str(i) for i in retry(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)))
