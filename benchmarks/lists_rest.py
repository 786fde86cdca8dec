"""The lines of a gpu_cells.sh list whose cell has no recorded outcome yet in the given `pcgh cell --json` files:
what the next device call runs after a list was cut by its timeout (cells not started, or killed, come back).
With --passed only passing outcomes count (a cell that ran out of memory or failed on a bug since fixed comes
back too). Lines of other JSON files (no "spec") are skipped.

    python benchmarks/lists_rest.py [--passed] LIST RESULTS.jsonl [...] > REST
"""

from __future__ import annotations

import json
import sys


def key(model: str, layers: str, attention: str, graph: str, compiler: str, quant: str, tokens: str | int,
        parallel: str = "tp1") -> tuple:
    """A cell as a list line names it (gpu_cells.sh runs every line tp1)."""
    return model, layers, attention, graph, compiler, quant, int(tokens), parallel


def line_key(line: str) -> tuple:
    spec, attention, graph, *rest = line.split()
    compiler, quant, tokens = (rest + ["eager", "none", "256"][len(rest):])[:3]
    model, _, layers = spec.partition(":")
    return key(model, layers, attention, graph, compiler, quant, tokens)


def recorded(paths: list[str], passed: bool = False, device: str | None = None) -> set[tuple]:
    """The keys of the outcomes in these JSON-lines files (passing ones only with `passed`; run on `device` only,
    if given)."""
    done = set()
    for path in paths:
        for line in open(path):
            if line.strip().startswith("{"):
                obj = json.loads(line)
                s = obj.get("spec")
                if s is None or (passed and obj.get("status") != "pass") or (device and s.get("device") != device):
                    continue
                layers = "tiny" if s["tiny"] else str(s["layers"])
                done.add(key(s["model"], layers, s.get("attention", "sdpa"), s["graph"], s.get("compiler", "eager"),
                             s.get("quant", "none"), s["max_tokens"], s.get("parallel", "tp1")))
    return done


def main(argv: list[str]) -> int:
    passed = bool(argv) and argv[0] == "--passed"
    argv = argv[1:] if passed else argv
    if len(argv) < 2:
        raise SystemExit(__doc__)
    done = recorded(argv[1:], passed)
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
