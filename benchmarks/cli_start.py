"""How long `pcgh` takes to answer the commands that run no model: `--help`, `report`, `diff`, `requests`, `models`, and
to refuse a YAML "billion laughs" matrix (`run bomb.yaml --dry-run`, which exits 2).

Each sample is a fresh `python -m harness.cli …` process, timed from spawn to exit (what a user or a CI step
waits for), on a copy of the committed nightly store (2 runs × 504 cells). The target is ≤ 1 s each; the
median of --repeat samples is printed with whether torch was imported, and with --base another tree's
numbers beside them (samples alternate, so both see the same load) and the ratio base / this.

    python benchmarks/cli_start.py
    python benchmarks/cli_start.py --base /tmp/old-tree --repeat 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY = ROOT / "benchmarks" / "results" / "2026-11-29-h200" / "nightly" / "nightly.db"
TARGET_S = 1.0
COMMANDS = {"--help": ["--help"], "report 1": ["report", "1", "--db", "{db}"], "diff 1 2": ["diff", "1", "2", "--db", "{db}"],
            "requests": ["requests", "--db", "{db}"], "models": ["models"], "run bomb": ["run", "{bomb}", "--dry-run"]}
# 10**9 "x" once its aliases are expanded, in 600 bytes.
BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x, x]"] + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]"
                                                            for i in range(8)]) + "\nname: bomb\naxes: {model: [qwen3-0.6b:tiny]}\n"
# Run inside the child after the command, to say whether it imported torch (a command that exits through
# SystemExit, like --help, still reaches it).
CHILD = ("import runpy, sys\nsys.argv = ['pcgh', *sys.argv[1:]]\ntry:\n    runpy.run_module('harness.cli', run_name='__main__')\n"
         "except SystemExit:\n    pass\nfinally:\n    sys.stderr.write('torch=%s\\n' % ('torch' in sys.modules))\n")


LIMIT_S = 60.0  # a sample still running then is stopped and counted as this (c011d1d took 44 s on the bomb)


def sample(tree: Path, argv: list[str]) -> tuple[float, bool]:
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=tree, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(tree)}, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        return LIMIT_S, True
    elapsed = time.perf_counter() - t
    if "torch=" not in p.stderr:
        raise SystemExit(f"{tree}: pcgh {' '.join(argv)} failed:\n{p.stderr[-2000:]}")
    return elapsed, "torch=True" in p.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--base", type=Path, help="another checkout to time side by side")
    args = ap.parse_args(argv)
    trees = {"this": ROOT, **({"base": args.base.resolve()} if args.base else {})}
    with tempfile.TemporaryDirectory() as tmp:
        db, bomb = Path(tmp) / "nightly.db", Path(tmp) / "bomb.yaml"
        shutil.copy(NIGHTLY, db)
        bomb.write_text(BOMB)
        times: dict[tuple[str, str], list[float]] = {}
        torch: dict[tuple[str, str], bool] = {}
        for name, cmd in COMMANDS.items():
            full = [a.format(db=db, bomb=bomb) for a in cmd]
            for tree in trees:  # one warm-up each: the OS file cache, not what a second run of pcgh would skip
                sample(trees[tree], full)
            for _ in range(args.repeat):
                for tree, path in trees.items():
                    t, imported = sample(path, full)
                    times.setdefault((tree, name), []).append(t)
                    torch[(tree, name)] = imported
    ok = True
    print(f"pcgh start-up, median of {args.repeat} fresh processes (s), {os.cpu_count()} CPUs; target ≤ {TARGET_S:.1f} s")
    head = f"{'command':12s} {'this':>7s} {'torch':>6s}" + (f" {'base':>7s} {'torch':>6s} {'base/this':>9s}" if args.base else "")
    print(head)
    for name in COMMANDS:
        this = statistics.median(times[("this", name)])
        ok &= this <= TARGET_S
        line = f"{name:12s} {this:7.2f} {str(torch[('this', name)]):>6s}"
        if args.base:
            base = statistics.median(times[("base", name)])
            line += f" {base:7.2f} {str(torch[('base', name)]):>6s} {base / this:8.1f}×"
        print(line + ("" if this <= TARGET_S else "  over target"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
