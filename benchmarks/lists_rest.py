"""The lines of a gpu_cells.sh list whose cell has no recorded outcome yet in the given `pcgh cell --json` files:
what the next device call runs after a list was cut by its timeout (cells not started, or killed, come back).

    python benchmarks/lists_rest.py LIST RESULTS.jsonl [...] > REST
"""

from __future__ import annotations

import json
import sys


def key(model: str, layers: str, attention: str, graph: str, compiler: str, quant: str, tokens: str) -> tuple:
    return model, layers, attention, graph, compiler, quant, int(tokens)


def line_key(line: str) -> tuple:
    spec, attention, graph, *rest = line.split()
    compiler, quant, tokens = (rest + ["eager", "none", "256"][len(rest):])[:3]
    model, _, layers = spec.partition(":")
    return key(model, layers, attention, graph, compiler, quant, tokens)


def recorded(paths: list[str]) -> set[tuple]:
    done = set()
    for path in paths:
        for line in open(path):
            if line.strip().startswith("{"):
                s = json.loads(line)["spec"]
                layers = "tiny" if s["tiny"] else str(s["layers"])
                done.add(key(s["model"], layers, s["attention"], s["graph"], s["compiler"], s["quant"], s["max_tokens"]))
    return done


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    done = recorded(argv[1:])
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
