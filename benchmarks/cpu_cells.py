"""How long a first `pcgh cell` takes on this machine: every supported architecture (tiny, synthetic) on every attention
backend that runs on a CPU, with pcgh's defaults (the CPU's 64-token ladder), each in a fresh process as a user
types it — start-up, load, eager, reference, capture, the suite, latency. Prints a markdown table (wall seconds,
the cell's own phases) and the slowest; writes it with --out.

    python benchmarks/cpu_cells.py --graph piecewise --out benchmarks/results/<date>-cpu-first-cells/cells.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.cards import load_cards
from harness.metrics import CellMetrics
from pcg_core.capabilities import attention_unsupported_reason


def _cells(graph: str) -> list[tuple[str, str]]:
    cards = {cid: c for cid, c in load_cards().items() if c.runtime_reason is None}
    return [(cid, att) for cid, card in sorted(cards.items()) for att in ("sdpa", "flex", "varlen")
            if attention_unsupported_reason(att, "cpu", card.features) is None]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="piecewise")
    ap.add_argument("--limit-s", type=float, default=30.0, help="the target per cell")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows, over = [], []
    for model, att in _cells(args.graph):
        cmd = [sys.executable, "-m", "harness.cli", "cell", "--model", model, "--tiny", "--graph", args.graph,
               "--attention", att, "--device", "cpu", "--json"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wall = time.perf_counter() - t0
        try:
            out = json.loads(p.stdout[p.stdout.index("{"):])
            status, phases = out["status"], CellMetrics.lenient(out["metrics"]).process.phase_s
        except (ValueError, KeyError):
            status, phases = f"no result (rc {p.returncode})", {}
        phase = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        rows.append(f"| {model} | {att} | {status} | {wall:.1f} | {phase} |")
        if wall > args.limit_s:
            over.append((wall, model, att))
        print(rows[-1], flush=True)
    load = os.getloadavg()[0]
    table = "\n".join([f"`pcgh cell --model M --tiny --graph {args.graph} --attention A --device cpu` (pcgh's defaults), "
                       f"one fresh process each, {os.cpu_count()} cores, load {load:.1f} at the end", "",
                       "| model | attention | status | wall s | phases (s) |", "|---|---|---|---|---|", *rows, "",
                       f"{len(rows) - len(over)} of {len(rows)} within {args.limit_s:g} s"
                       + ("; over: " + ", ".join(f"{m} {a} {w:.0f} s" for w, m, a in sorted(over, reverse=True))
                          if over else "")])
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
