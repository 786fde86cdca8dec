"""The cells of a gpu_cells.sh folder (`<i>.json`, one `pcgh cell --json` outcome each) to run again alone: those that
ran out of memory, those that crashed while the device had under `free_gib` GiB free (the reason's note from
harness/cell/crash.py), and those whose reference layer could not be measured for memory (the cell's verdict stands,
but its record lacks the layer: gpt-oss-120b:2 beside two DeepSeek-V3:4 cells on the H100, 2026-12-08): cells side by
side on one GPU fail so when together they fill it. Prints their list indices, one a line, in order.

    python3 benchmarks/cells_retry.py OUT/NAME [FREE_GIB]
    python3 benchmarks/cells_retry.py --keep FIRST.json AGAIN.json   # exit 0: the retry's record replaces the first
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOM = re.compile(r"\[device memory free at the crash: ([0-9.]+) of [0-9.]+ GiB\]")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # a cell killed before it wrote its outcome: nothing says it was memory
        return None


def _short_of_memory(obj: dict, free_gib: float) -> bool:
    """The cell's verdict itself was lost to memory (out of it, or a crash with the device all but full)."""
    room = ROOM.search(obj.get("reason") or "")
    return obj.get("status") == "oom" or (room is not None and float(room.group(1)) < free_gib)


def _reference_oom(obj: dict) -> bool:
    """A whole verdict whose reference layer alone ran out of memory."""
    check = ((obj.get("metrics") or {}).get("judge") or {}).get("reference") or {}
    return check.get("status") == "not_measured" and "OutOfMemoryError" in (check.get("reason") or "")


def retry(folder: Path, free_gib: float = 2.0) -> list[int]:
    out = []
    for path in folder.glob("*.json"):
        obj = _read(path)
        if obj is not None and (_short_of_memory(obj, free_gib) or _reference_oom(obj)):
            out.append(int(path.stem))
    return sorted(out)


def keep_again(first: Path, again: Path, free_gib: float = 2.0) -> bool:
    """Does the retry's record replace the first? Where it wrote one, unless the first was a whole verdict (only its
    reference layer short of memory) and the retry's is not: a retry killed or out of memory loses nothing."""
    new, old = _read(again), _read(first)
    if new is None:
        return False
    return old is None or _short_of_memory(old, free_gib) or not _short_of_memory(new, free_gib)


if __name__ == "__main__":
    if sys.argv[1] == "--keep":  # FIRST AGAIN: exit 0 where the retry's record replaces the first
        sys.exit(0 if keep_again(Path(sys.argv[2]), Path(sys.argv[3])) else 1)
    print("\n".join(str(i) for i in retry(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)))
