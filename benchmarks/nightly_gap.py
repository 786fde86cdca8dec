"""The nightly matrix's cells that one H200 can launch and that have no passing `pcgh cell --json` record yet, as
gpu_cells.sh list lines (stdout), with a count per quantization scheme (stderr): what the next device session runs,
and the evidence that an issue's cells all pass ("0 without a pass").

The cells are the launcher's own (expand + pre-check, as `pcgh run` plans them) with one CUDA device assumed, so
this answers on the CPU machine too. Records count when they ran on CUDA at the cell's max_tokens and passed:
`pcgh cell --json` lines (gpu_cells.sh's .jsonl) and the cells of every run in a store (`pcgh run`'s .db).

    python benchmarks/nightly_gap.py [--quant GLOB] [--reference] [--matrix harness/configs/nightly.yaml] [RESULTS.jsonl|.db ...]
    (no RESULTS: every benchmarks/results/*/*.jsonl and *.db)
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import glob
import sys
from pathlib import Path

from harness.matrix import expand, load_matrix, precheck
from harness.outcome import ModelRef
from harness.store import Store
from lists_rest import key, recorded  # benchmarks/, beside this script
from pcg_core.capabilities import capabilities

ROOT = Path(__file__).resolve().parents[1]


def passed_on_cuda(paths: list[str], reference: bool = False) -> set[tuple]:
    """lists_rest keys of the passing CUDA records (with `reference`, only those whose reference layer passed too):
    JSON lines, and every run's cells in the stores (read-only)."""
    done = recorded([p for p in paths if not p.endswith(".db")], passed=True, device="cuda", reference=reference)
    for path in (p for p in paths if p.endswith(".db")):
        with Store(path, read_only=True) as store:
            for run in store.runs():
                for r in store.results(run.id):
                    a, m = r.axes, r.metrics
                    ref_ok = m.judge.reference is not None and m.judge.reference.status == "pass"
                    if r.passed and m.settings.device == "cuda" and (ref_ok or not reference):
                        done.add(key(ModelRef.parse(a["model"]).card, "tiny" if m.settings.tiny else str(m.settings.layers),
                                     a["attention"], a["graph"], a["compiler"], a["quant"], m.settings.max_tokens, a["parallel"],
                                     a.get("kv_cache") or "auto"))
    return done


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", default=str(ROOT / "harness" / "configs" / "nightly.yaml"))
    ap.add_argument("--quant", default="*", help="only cells whose quant matches this glob (e.g. 'fp8*', 'int8*')")
    ap.add_argument("--reference", action="store_true",
                    help="count only records whose reference layer passed too (issue 47: cells judged against eager "
                         "alone, or whose reference was not measured, come back)")
    ap.add_argument("results", nargs="*")
    args = ap.parse_args(argv)
    results = sorted(glob.glob(str(ROOT / "benchmarks" / "results" / "*" / "*.jsonl"))
                     + glob.glob(str(ROOT / "benchmarks" / "results" / "*" / "*.db")))
    done = passed_on_cuda(args.results or results, args.reference)
    caps = capabilities() | {"cuda_devices": 1}
    cards: dict = {}
    launch, missing = collections.Counter(), collections.Counter()
    for cell in expand(load_matrix(args.matrix)):
        s = cell.spec
        if s.device != "cuda" or not fnmatch.fnmatchcase(s.quant, args.quant) or precheck(cell, caps, cards):
            continue
        layers = "tiny" if s.tiny else str(s.layers)
        launch[s.quant] += 1
        if key(s.model, layers, s.attention, s.graph, s.compiler, s.quant, s.max_tokens, s.parallel, s.kv_cache) in done:
            continue
        missing[s.quant] += 1
        if s.parallel != "tp1":  # gpu_cells.sh lines carry no parallel field: such a cell cannot be listed
            print(f"# {s.model}:{layers} {s.attention} {s.graph} {s.compiler} {s.quant} {s.max_tokens} {s.parallel}")
        else:
            kv = "" if s.kv_cache == "auto" else f" {s.kv_cache}"
            print(f"{s.model}:{layers} {s.attention} {s.graph} {s.compiler} {s.quant} {s.max_tokens}{kv}")
    for quant in sorted(launch):
        print(f"{quant}: {launch[quant]} launchable on one H200, {missing[quant]} without a pass", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
