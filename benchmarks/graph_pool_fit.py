"""Refit harness/shape/graph_pool.json — the graph-pool estimate `pcgh request` prints — to the pools the GPU cells
measured, and print how far each measured pool lies from its estimate.

    python benchmarks/graph_pool_fit.py            # the fit and its ratios; nothing written
    python benchmarks/graph_pool_fit.py --write    # also write harness/shape/graph_pool.json

Which cells: every passing or failing cell under benchmarks/results/ that ran on CUDA at real widths (trim:N or
whole; tiny widths are not a model's), one rank, compiler eager, with a recorded `graph_pool_bytes`, and a model card
whose config the estimate can read. A configuration measured again in a later results folder (they are dated) counts
at its latest measurement only, since the code measured changed (experts dequantized per forward before the grouped
kernel came); within one folder, at the median of its runs. sdpa's plain-math attention (a model with soft-cap or sinks on sdpa, under a
backend that captures attention) is left out: its scores over the whole cache grow with the cell's cache, not with
the model. Quantized MoE cells from before GROUPED_MOE_SINCE are left out (their experts were dequantized per forward).

The fit: per capture backend, non-negative least squares on the relative error of the unquantized cells (each cell
weighs the same whatever its size); per quantization scheme, a factor, the median of measured / unquantized estimate
over that scheme's cells; the band, the 5th and 95th percentile of measured / estimate over every cell used.
Needs numpy and scipy (dev tools, not pcg's dependencies).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.cards import find_card  # noqa: E402
from harness.metrics import CellMetrics  # noqa: E402
from harness.matrix.fit import trimmed  # noqa: E402
from harness.shape.graph_pool import FEATURES, TABLE, features  # noqa: E402
from harness.shape.graph_pool import table as committed_table  # noqa: E402
from harness.shape.structure import Structure, read_structure  # noqa: E402

MATH_ATTENTION = ("softcap", "sinks")  # features sdpa runs in plain math over the whole cache
CAPTURING = ("piecewise", "full")  # backends whose graphs hold attention (breakable runs it between graphs)
# Quantized MoE cells measured before the grouped MoE GEMM (kernels/moe_gemm.py, results folder 2026-12-03c) dequantized
# every expert to bf16 per forward inside the graphs: pools of code that no longer runs.
GROUPED_MOE_SINCE = "2026-12-03c"


def measured_pools(root: Path = ROOT / "benchmarks" / "results") -> list[dict[str, Any]]:
    """One row per configuration measured: the keys below, `pool` (median bytes) and `structure` (trimmed config)."""
    pools: dict[tuple, list[int]] = defaultdict(list)
    last: dict[tuple, str] = {}
    for path in sorted(root.glob("**/*.jsonl")):  # folders are dated: later results after earlier ones
        folder = path.relative_to(root).parts[0]
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            s, m = r.get("spec") or {}, CellMetrics.lenient(r.get("metrics"))  # flat (older results) or grouped
            pool = m.capture.graph_pool_bytes
            if not (str(s.get("device", "")).startswith("cuda") and pool) or s.get("tiny"):
                continue
            if s.get("parallel", "tp1") != "tp1" or s.get("compiler", "eager") != "eager":
                continue
            if s.get("quant", "none") != "none" and folder < GROUPED_MOE_SINCE and "moe" in _card_features(s["model"]):
                continue
            key = (s["model"], m.settings.layers or s.get("layers"), s["graph"], s["attention"], s.get("quant", "none"),
                   int(s["max_tokens"]), m.settings.dtype or s.get("dtype") or "bfloat16")
            pools[key].append(int(pool))
            if folder != last.setdefault(key, folder):  # a later folder's measurement replaces the earlier
                pools[key], last[key] = [int(pool)], folder
    rows = []
    for (model, layers, graph, attention, quant, max_tokens, dtype), values in pools.items():
        card = find_card(model)
        if card is None or dtype != "bfloat16":
            continue
        if attention == "sdpa" and graph in CAPTURING and set(card.features) & set(MATH_ATTENTION):
            continue
        structure = read_structure(trimmed(card.config, layers), f"card {model}")
        rows.append({"model": model, "layers": layers, "graph": graph, "attention": attention,
                     "quant": "nvfp4" if quant == "fp4" else quant, "max_tokens": max_tokens,
                     "pool": int(statistics.median(values)), "structure": structure})
    return rows


def _card_features(model: str) -> list[str]:
    card = find_card(model)
    return list(card.features) if card else []


def _x(s: Structure, max_tokens: int) -> list[float]:
    f = features(s, max_tokens)
    return [f[k] for k in FEATURES]


def fit(rows: list[dict[str, Any]], gpu: str) -> dict[str, Any]:
    import numpy as np
    from scipy.optimize import nnls

    coefficients = {}
    for graph in ("piecewise", "breakable", "full"):
        sel = [r for r in rows if r["graph"] == graph and r["quant"] == "none"]
        x = np.array([_x(r["structure"], r["max_tokens"]) for r in sel])
        y = np.array([r["pool"] for r in sel], dtype=float)
        coef, _ = nnls(x / y[:, None], np.ones(len(y)))
        coefficients[graph] = {k: round(float(c), 3) for k, c in zip(FEATURES, coef)}
    table = {"gpu": gpu, "dtype": "bfloat16", "coefficients": coefficients, "quant_factor": {}, "cells": len(rows),
             "band": [0.0, 0.0]}
    by_quant: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["quant"] != "none":
            base = _estimate(table, r)
            by_quant[r["quant"]].append(r["pool"] / base)
    table["quant_factor"] = {q: round(statistics.median(v), 2) for q, v in sorted(by_quant.items())}
    ratios = [r["pool"] / _estimate(table, r, r["quant"]) for r in rows]
    q = statistics.quantiles(ratios, n=20)
    table["band"] = [round(q[0], 2), round(q[-1], 2)]
    return table


def _estimate(table: dict[str, Any], r: dict[str, Any], quant: str = "none") -> float:
    f = features(r["structure"], r["max_tokens"])
    factor = table["quant_factor"].get(quant, 1.0)
    return factor * sum(table["coefficients"][r["graph"]][k] * f[k] for k in FEATURES)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {TABLE.relative_to(ROOT)}")
    p.add_argument("--gpu", default="H200", help="the GPU the results were measured on (the table's label)")
    args = p.parse_args(argv)
    rows = measured_pools()
    table = fit(rows, args.gpu)
    print(json.dumps({k: v for k, v in table.items()}, indent=1))
    worst = sorted(rows, key=lambda r: r["pool"] / _estimate(table, r, r["quant"]))
    print("\nfarthest from their estimate (measured / estimated):")
    for r in worst[:5] + worst[-5:]:
        est = _estimate(table, r, r["quant"])
        print(f"  {r['pool'] / est:5.2f}  {r['model']}:trim:{r['layers']} {r['graph']} {r['attention']} {r['quant']} "
              f"T={r['max_tokens']}: {r['pool'] / 2**30:.2f} GiB measured, {est / 2**30:.2f} estimated")
    if args.write:
        TABLE.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        committed_table.cache_clear()  # this process reads the new coefficients from now on
        print(f"wrote {TABLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
