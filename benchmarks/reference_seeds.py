"""The judge's reference layer over seeds, for false fails: every (model, quant) of a matrix that launches here, each
seed's synthetic weights loaded (and quantized) as its cell would, pcg's eager run on the layer's cases, then the
layer itself (harness/cell/judge/reference.py) — no capture, no graph: only whether the layer calls a right eager
wrong.

    python benchmarks/reference_seeds.py                      # the smoke matrix (CPU), 20 seeds
    python benchmarks/reference_seeds.py --seeds 5 --filter qwen3-0.6b:tiny
    python benchmarks/reference_seeds.py --kv-cache fp8_e4m3      # the same with an FP8 KV cache

Prints one line per (model, quant) — passes, the worst |Δlogprob| mean and max against their bounds, the worst kernel
error — and every false fail; exits 1 if there is one. tests/harness/cell/test_reference_seeds.py runs a slice.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
from dataclasses import replace
from pathlib import Path

from harness.cell import run as cell_run
from harness.cell.judge.reference import reference_cases, reference_layer
from harness.cell.spec import CellSpec
from harness.matrix import expand, load_matrix, precheck
from harness.metrics import ReferenceCheck
from pcg_core.capabilities import capabilities
from pcg_core.config import CaptureConfig, EngineConfig

ROOT = Path(__file__).resolve().parents[1]


def combinations(matrix: str, pattern: str = "*") -> list[CellSpec]:
    """One spec per (model, quant, attention) of the matrix that passes the pre-check here (the graph axis dropped:
    the layer never sees the graph)."""
    caps, cards, seen, out = capabilities(), {}, set(), []
    for cell in expand(load_matrix(matrix)):
        s = cell.spec
        key = (s.model, s.quant, s.attention, s.tiny, s.layers)
        if key in seen or precheck(cell, caps, cards) or not fnmatch.fnmatchcase(f"{s.model}{':tiny' if s.tiny else ''}", pattern):
            continue
        seen.add(key)
        out.append(s)
    return out


def probe(spec: CellSpec, seed: int, kv_cache: str = "auto") -> ReferenceCheck:
    """The reference layer's verdict on `spec`'s eager run under `seed` (as run_cell loads and quantizes it, an FP8
    KV cache's scales calibrated as it calibrates them)."""
    spec = replace(spec, seed=seed, kv_cache=kv_cache)
    capture = CaptureConfig(backend="disabled", max_tokens=spec.max_tokens)
    config = EngineConfig(device=spec.device, dtype=spec.dtype, attention=spec.attention, capture=capture,
                          kv_cache=kv_cache)
    cell = cell_run._Cell(spec, config, cell_run.recorded_settings(spec))
    cell_run._load(cell)
    chosen, _ = reference_cases(cell.cases)
    outputs = cell.run_suite(cell.engine("disabled"), cases=chosen)
    return reference_layer(cell.lm.model, replace(config, kv_slots=cell.kv_slots), chosen, outputs, spec.quant != "none")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", default=str(ROOT / "harness" / "configs" / "smoke.yaml"))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--filter", default="*", help="model glob (with ':tiny' for tiny cells)")
    ap.add_argument("--kv-cache", default="auto", help="the KV cache's dtype (fp8_e4m3: the FP8 reference)")
    args = ap.parse_args(argv)
    false_fails = []
    for spec in combinations(args.matrix, args.filter):
        t0, checks = time.perf_counter(), []
        for seed in range(args.seeds):
            check = probe(spec, seed, args.kv_cache)
            checks.append(check)
            if check.status != "pass":
                false_fails.append(f"{spec.model} {spec.quant} {spec.attention} seed {seed}: {check.status}: {check.reason}")
        worst = max(checks, key=lambda c: (c.max_logprob_diff or 0) / (c.max_bound or 1))
        kernel = max((c.kernel_rel or 0.0) for c in checks)
        turned = [c.chance_turns for c in checks if c.chance_turns]  # float32 FP8 KV: positions within a chance turn
        chance = f"; chance FP8 turns in {len(turned)} seed(s), {sum(turned)} position(s)" if turned else ""
        print(f"{spec.model:16} {spec.quant:15} {spec.attention:6} {sum(c.status == 'pass' for c in checks):>2}/"
              f"{len(checks)} pass; worst max |Δlogprob| {worst.max_logprob_diff:.3g} ≤ {worst.max_bound:.3g}, mean "
              f"{max(c.mean_logprob_diff or 0 for c in checks):.3g} ≤ {worst.mean_bound:.3g}; kernels ≤ {kernel:.3g}{chance}; "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    for line in false_fails:
        print("FALSE FAIL:", line)
    print(f"{len(false_fails)} false fails")
    return 1 if false_fails else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
