"""The lines of a gpu_cells.sh list whose cell has no recorded outcome yet in the given `pcgh cell --json` files:
what the next device call runs after a list was cut by its timeout (cells not started, or killed, come back).
With --passed only passing outcomes count (a cell that ran out of memory or failed on a bug since fixed comes
back too); with --reference only those whose reference layer passed too (issue 47: a pass from before the layer,
or one whose reference was not measured, comes back). Lines of other JSON files (no "spec") are skipped.

    python benchmarks/lists_rest.py [--passed | --reference] LIST RESULTS.jsonl [...] > REST
"""

from __future__ import annotations

import json
import sys

from harness.metrics import CellMetrics
from pcg_core.quant.schemes.registry import canonical


def key(model: str, layers: str, attention: str, graph: str, compiler: str, quant: str, tokens: str | int,
        parallel: str = "tp1", kv_cache: str = "auto") -> tuple:
    """A cell as a list line names it (gpu_cells.sh runs every line tp1); the scheme in today's spelling (a record
    stored as `fp4` is the nightly's `nvfp4`)."""
    return model, layers, attention, graph, compiler, canonical(quant), int(tokens), parallel, kv_cache


def line_key(line: str) -> tuple:
    spec, attention, graph, *rest = line.split()
    compiler, quant, tokens, kv_cache = (rest + ["eager", "none", "256", "auto"][len(rest):])[:4]
    model, _, layers = spec.partition(":")
    return key(model, layers, attention, graph, compiler, quant, tokens, kv_cache=kv_cache)


def recorded(paths: list[str], passed: bool = False, device: str | None = None, reference: bool = False) -> set[tuple]:
    """The keys of the outcomes in these JSON-lines files (passing ones only with `passed`, passing the reference
    layer too with `reference`; run on `device` only, if given)."""
    done = set()
    for path in paths:
        for line in open(path):
            if line.strip().startswith("{"):
                obj = json.loads(line)
                s = obj.get("spec")
                if s is None or (passed and obj.get("status") != "pass") or (device and s.get("device") != device):
                    continue
                if reference and not reference_passed(obj):
                    continue
                layers = "tiny" if s["tiny"] else str(s["layers"])
                done.add(key(s["model"], layers, s.get("attention", "sdpa"), s["graph"], s.get("compiler", "eager"),
                             s.get("quant", "none"), s["max_tokens"], s.get("parallel", "tp1"),
                             s.get("kv_cache") or "auto"))
    return done


def reference_passed(obj: dict) -> bool:
    """A `pcgh cell --json` outcome that passed and whose reference layer passed (not merely not measured)."""
    ref = CellMetrics.lenient(obj.get("metrics")).judge.reference  # flat (older results) or grouped
    return obj.get("status") == "pass" and ref is not None and ref.status == "pass"


def main(argv: list[str]) -> int:
    reference = bool(argv) and argv[0] == "--reference"
    passed = reference or (bool(argv) and argv[0] == "--passed")
    argv = argv[1:] if passed else argv
    if len(argv) < 2:
        raise SystemExit(__doc__)
    done = recorded(argv[1:], passed, reference=reference)
    seen = set()
    for line in open(argv[0]):
        text = line.strip()
        if text.startswith("#") or not text:
            continue
        k = line_key(text)
        if k not in done and k not in seen:
            seen.add(k)
            print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
