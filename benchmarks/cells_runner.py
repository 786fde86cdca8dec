"""Runs gpu_cells.sh's cells side by side on one GPU: at most `jobs` at a time, as xargs -P did, and no more together
than the GPU holds by the peaks earlier cells of the same kind recorded (`process.peak_gpu_bytes` in
benchmarks/results/**/*.jsonl).

Why: three DeepSeek-V3:4 cells (32 GiB each) on one H100 ran it out of memory, one crashing in cuDNN with an internal
error, another running out while loading; their retries, alone at the end, found no time left (2026-12-07f). A cell
whose kind has no recorded peak is started as before (the jobs limit alone), and its own run records one for the
next call: the packing is measured, never guessed.

    python3 benchmarks/cells_runner.py TODO --jobs J [--gpu-gib G] [--results DIR] [--command CMD]

TODO holds gpu_cells.sh's numbered list lines (`i model:layers attention graph [compiler [quant [tokens [kv]]]]`).
Cells start in list order; one that does not fit beside the running ones waits, and a later one that fits may go
first (its peak known and within what is left). CMD (default gpu_cells.sh's exported run_cell) is run as
`CMD INDEX FIELD…` for each line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
MARGIN = 1.10  # a peak measured once may be a little higher the next time (other prompts' padding, the allocator)
CONTEXT_GIB = 1.0  # the CUDA context and the libraries' workspaces, outside the allocator's peak


@dataclass(frozen=True)
class Cell:
    index: int
    fields: tuple[str, ...]  # the list line's fields after the index, as run_cell takes them

    @property
    def kind(self) -> tuple[str, str, str, str]:
        """(model:layers, quant, graph, kv cache): what sets a cell's memory, as its line names it."""
        f = self.fields
        spec, graph = f[0], f[2]
        quant = f[4] if len(f) > 4 else "none"
        kv = f[6] if len(f) > 6 else "auto"
        return spec, quant, graph, kv


def read_todo(lines: Iterable[str]) -> list[Cell]:
    cells = []
    for line in lines:
        parts = line.split()
        if parts and not parts[0].startswith("#"):
            cells.append(Cell(int(parts[0]), tuple(parts[1:])))
    return cells


def recorded_peaks(results: Path) -> dict[tuple[str, str, str, str], int]:
    """The highest peak each kind of cell recorded, over every outcome line under `results`."""
    peaks: dict[tuple[str, str, str, str], int] = {}
    for path in results.glob("**/*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                obj = json.loads(line)
                spec, peak = obj["spec"], (obj.get("metrics") or {}).get("process", {}).get("peak_gpu_bytes")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if not isinstance(peak, int) or not isinstance(spec, dict):
                continue
            size = "tiny" if spec.get("tiny") else str(spec.get("layers"))
            kind = (f"{spec.get('model')}:{size}", str(spec.get("quant", "none")), str(spec.get("graph")),
                    str(spec.get("kv_cache", "auto")))
            peaks[kind] = max(peak, peaks.get(kind, 0))
    return peaks


def need(cell: Cell, peaks: dict[tuple[str, str, str, str], int]) -> float | None:
    """GiB the cell is planned with: its kind's recorded peak, else the same model, size and quantization under any
    graph backend or KV cache (the highest), with a margin and the context; None where nothing was recorded."""
    spec, quant, graph, kv = cell.kind
    peak = peaks.get((spec, quant, graph, kv))
    if peak is None:
        near = [p for (s, q, _, _), p in peaks.items() if (s, q) == (spec, quant)]
        peak = max(near) if near else None
    return None if peak is None else peak * MARGIN / GIB + CONTEXT_GIB


def pick(waiting: list[Cell], running_gib: list[float], jobs: int, gpu_gib: float | None,
         peaks: dict[tuple[str, str, str, str], int]) -> list[tuple[Cell, float]]:
    """The waiting cells to start now, in list order, each with the GiB it is planned with (0: unknown), beside
    running cells planned at `running_gib`: while jobs are free, the head of the list if it fits (a cell of unknown
    peak fits; on an idle GPU anything fits); once one waits, only later cells whose known peak fits go past it (an
    unknown one might take the room the waiting one needs)."""
    chosen: list[tuple[Cell, float]] = []
    used, count, blocked = sum(running_gib), len(running_gib), False
    for cell in waiting:
        if count >= jobs:
            break
        gib = need(cell, peaks)
        if gib is None:
            fits = not blocked
        else:
            fits = gpu_gib is None or count == 0 or used + gib <= gpu_gib
        if not fits:
            blocked = True
            continue
        chosen.append((cell, gib or 0.0))
        used, count = used + (gib or 0.0), count + 1
    return chosen


def run(cells: list[Cell], jobs: int, gpu_gib: float | None, peaks: dict[tuple[str, str, str, str], int],
        command: list[str], poll_s: float = 0.5) -> None:
    """Every cell run through `command`, started as `pick` allows; returns when all have ended."""
    waiting = list(cells)
    running: dict[subprocess.Popen, float] = {}  # a cell's process → the GiB it was planned with (0: unknown)
    while waiting or running:
        for proc in [p for p in running if p.poll() is not None]:
            del running[proc]
        for cell, gib in pick(waiting, list(running.values()), jobs, gpu_gib, peaks):
            running[subprocess.Popen([*command, str(cell.index), *cell.fields])] = gib
            waiting.remove(cell)
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("todo")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--gpu-gib", type=float, default=None, help="the GPU's memory (default: no memory limit)")
    p.add_argument("--results", default=str(Path(__file__).with_name("results")))
    p.add_argument("--command", default="bash -c 'run_cell \"$@\"' _", help="what runs one cell, its fields appended")
    a = p.parse_args(argv)
    cells = read_todo(Path(a.todo).read_text().splitlines())
    peaks = recorded_peaks(Path(a.results))
    run(cells, a.jobs, a.gpu_gib, peaks, shlex.split(a.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
