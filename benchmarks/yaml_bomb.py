"""Loading hostile and large matrix files: what `pcgh run --dry-run` pays before it lists a single cell.

It times harness.matrix.load_matrix — the function harness/launcher/plan.py calls — on a "billion laughs"
matrix (nine levels of nine aliases: 1 KB that expands to 10^9 values; it took 44 s and 4 GB before it was
refused up front), a 5 MB matrix of legal structure (73 s before; now over the size cap), a 500 KB legal matrix
(many models, each with a comment: it must load, in time linear in its size) and the biggest committed matrix.
One more row loads *and expands* the largest matrix the limits allow (~100,000 cells, 200 excludes, 200
overrides), which took ~55 s to expand when every cell was matched against every rule. Prints the median of
--repeat runs and the peak Python heap of one more, and exits 1 if the bomb is not refused within a second.

    python benchmarks/yaml_bomb.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.matrix import expand, load_matrix  # noqa: E402  (the tree this script sits in)
from pcg_core.errors import ConfigError  # noqa: E402

BOMB_LIMIT_S = 1.0
CARDS = ["qwen3-0.6b", "qwen3-8b", "qwen2.5-0.5b", "llama-3.1-8b", "mixtral-8x7b", "deepseek-v3"]


def billion_laughs() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "name: lol\naxes:\n  model: [qwen3-0.6b:tiny]\n" + "\n".join(lines) + "\n"


def legal(n_bytes: int) -> str:
    out, size, i = ["# many models, each with a comment", "name: large", "axes:", "  model:"], 0, 0
    while size < n_bytes:
        line = f"    - {CARDS[i % len(CARDS)]}:trim:{i % 20 + 1}  # model {i}: why this entry is in the matrix"
        out.append(line)
        size, i = size + len(line) + 1, i + 1
    return "\n".join([*out, "  graph: [piecewise, breakable, full]"]) + "\n"


def many_rules() -> str:
    models = [f"{c}:trim:{i}" for c in CARDS[:4] for i in range(1, 21)]  # 80
    quants = ["none", "fp8", "int8", "awq", "gptq", "fp4", "w4a8", "nvfp4", "mxfp4", "int4"]
    lines = ["name: many", "axes:", f"  model: [{', '.join(models)}]", f"  quant: [{', '.join(quants)}]",
             f"  parallel: [{', '.join(f'tp{i}' for i in range(1, 21))}]", "  graph: [piecewise, breakable, full]",
             "  compiler: [eager, inductor]", "exclude:"]
    lines += [f"  - {{model: '{models[i % 80]}', parallel: tp{i % 20 + 1}, quant: {quants[i % 10]}}}" for i in range(200)]
    patterns = models + ["?" + m[1:] for m in models] + ["*" + m[2:] for m in models[:40]]
    return "\n".join([*lines, "overrides:", *(f"  '{p}': {{timeout_s: {i + 1}}}" for i, p in enumerate(patterns))]) + "\n"


def once(path: Path, and_expand: bool = False) -> tuple[float, str]:
    start = time.perf_counter()
    try:
        m = load_matrix(path)
        outcome = f"loaded: {len(m.axes.model)} models" + (f", {len(expand(m)):,} cells" if and_expand else "")
    except ConfigError as e:
        outcome = "refused: " + str(e).replace(str(path), path.name).splitlines()[-1].strip()[:70]
    return time.perf_counter() - start, outcome


def peak_mib(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    biggest = max((REPO / "harness" / "configs").glob("*.yaml"), key=lambda p: p.stat().st_size)
    with tempfile.TemporaryDirectory() as tmp:
        cases = {"billion laughs": Path(tmp) / "bomb.yaml", "5 MB legal structure": Path(tmp) / "5mb.yaml",
                 "500 KB legal matrix": Path(tmp) / "500kb.yaml", f"biggest committed ({biggest.name})": biggest}
        cases["billion laughs"].write_text(billion_laughs())
        cases["5 MB legal structure"].write_text(legal(5 * 2**20))
        cases["500 KB legal matrix"].write_text(legal(500_000))
        cases["~100k cells, 400 rules: load + expand"] = Path(tmp) / "many.yaml"
        cases["~100k cells, 400 rules: load + expand"].write_text(many_rules())
        once(biggest)  # warm: imports, registries, model cards
        print(f"python {sys.version.split()[0]}, PyYAML {yaml.__version__} (libyaml: {yaml.__with_libyaml__}), "
              f"median of {args.repeat} runs")
        print(f"| {'case':<38} | {'bytes':>9} | {'median ms':>9} | {'peak heap MiB':>13} | outcome")
        print(f"|{'-' * 40}|{'-' * 11}|{'-' * 11}|{'-' * 15}|{'-' * 60}")
        bomb_ms, bomb_outcome = 0.0, ""
        for name, path in cases.items():
            full = name.endswith("expand")
            runs = [once(path, full) for _ in range(args.repeat)]
            ms = statistics.median(t for t, _ in runs) * 1000
            heap = peak_mib(lambda p=path: once(p, full))
            print(f"| {name:<38} | {path.stat().st_size:>9,} | {ms:>9.1f} | {heap:>13.1f} | {runs[0][1]}")
            if name == "billion laughs":
                bomb_ms, bomb_outcome = ms, runs[0][1]
    if bomb_ms >= BOMB_LIMIT_S * 1000 or not bomb_outcome.startswith("refused"):
        print(f"FAIL: the bomb took {bomb_ms:.0f} ms ({bomb_outcome})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
