"""FP8 KV-cache cells beside the same cells with the 16-bit cache: `python3 benchmarks/kv_fp8_table.py FP8.jsonl AUTO.jsonl`.

Each file holds `pcgh cell --json` lines (gpu_cells.sh gathers them). One Markdown row per cell of the FP8 file:
both statuses, graph vs eager at the same padding (0: bitwise), the reference layer's verdict and its mean |Δlogprob|
against its bound, KV bytes per token, and graph latency (ms) at each token count measured, FP8 / 16-bit.
"""

from __future__ import annotations

import json
import sys

from harness.outcome import CellOutcome

def _read(path: str) -> dict[tuple, tuple[dict, CellOutcome]]:
    out = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.strip().startswith("{"):
            continue
        obj = json.loads(line)
        spec = obj["spec"]
        out[(spec["model"], spec.get("layers"), spec.get("attention"), spec["graph"])] = (spec, CellOutcome.model_validate(obj))
    return out


def _fmt(v: float | None, spec: str = ".3g") -> str:
    return "–" if v is None else format(v, spec)


def main(fp8_path: str, auto_path: str) -> int:
    fp8, auto = _read(fp8_path), _read(auto_path)
    tokens = sorted({n for _, o in fp8.values() for n in o.metrics.latency.latency_ms})  # the latency token counts measured
    print("| model | layers | attention | graph | FP8 | 16-bit | same padding | reference (mean Δ / bound) | KV B/token "
          "FP8 / 16-bit | " + " | ".join(f"graph ms @{n} FP8 / 16-bit" for n in tokens) + " | reason |")
    print("|---" * (10 + len(tokens)) + "|")
    for key, (spec, o) in fp8.items():
        m = o.metrics
        a = auto.get(key, (None, None))[1]
        ref = m.judge.reference
        ref_text = "–" if ref is None else f"{ref.status} ({_fmt(ref.mean_logprob_diff)} / {_fmt(ref.mean_bound)})"
        lat = []
        for n in tokens:
            g8 = m.latency.latency_ms.get(n)
            g16 = a.metrics.latency.latency_ms.get(n) if a else None
            lat.append(f"{_fmt(g8.graph if g8 else None, '.3f')} / {_fmt(g16.graph if g16 else None, '.3f')}")
        print(f"| {spec['model']} | {m.settings.layers} | {spec.get('attention')} | {spec['graph']} | {o.status} | "
              f"{a.status if a else '–'} | {_fmt(m.judge.max_same_padding_diff)} | {ref_text} | {m.memory.kv_bytes_per_token} / "
              f"{a.metrics.memory.kv_bytes_per_token if a else '–'} | " + " | ".join(lat) + f" | {o.reason[:120]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
