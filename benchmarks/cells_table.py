"""Markdown table of `pcgh cell --json` lines (one JSON object per line: the cell's outcome and its "spec")."""

from __future__ import annotations

import json
import sys

from harness.outcome import CellOutcome

TOKENS = (8, 128, 512, 2048)
PHASES = ("load", "eager", "reference", "capture", "run", "judge", "latency")  # harness/cell/run.py's, in order


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def main(path: str) -> int:
    lines = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    print("| model | layers | quant | kv cache | attention | graph | status | reference layer | token match | "
          "max Δlogprob prompt | max Δlogprob output | capture s | trace s | pool MiB | peak GiB | cell s | "
          "phases s (load/eager/ref/capture/run/judge/latency) | attn kernels (in run), build s | speedup @8 | "
          "@128 | @512 | @2048 | quant Δlogprob vs float | reason |")
    print("|---" * 24 + "|")
    for obj in lines:
        spec, o = obj["spec"], CellOutcome.model_validate(obj)
        m = o.metrics
        pool = None if m.capture.graph_pool_bytes is None else m.capture.graph_pool_bytes / 2**20
        peak = None if m.process.peak_gpu_bytes is None else m.process.peak_gpu_bytes / 2**30
        ref = m.judge.reference.status if m.judge.reference is not None else "–"
        phases = "/".join(_fmt(m.process.phase_s.get(p)) for p in PHASES)
        kernels = "–" if m.capture.attention_kernels is None else \
            f"{m.capture.attention_kernels} ({m.capture.attention_kernels_in_run}), {_fmt(m.capture.attention_build_s)}"
        print(f"| {spec['model']} | {m.settings.layers} | {spec.get('quant', 'none')} | {spec.get('kv_cache', 'auto')} | "
              f"{spec.get('attention', 'sdpa')} | {spec['graph']} | {o.status} | {ref} | {_fmt(m.judge.token_match)} | "
              f"{_fmt(m.judge.max_prompt_logprob_diff)} | {_fmt(m.judge.max_output_logprob_diff)} | {_fmt(m.capture.capture_s)} | "
              f"{_fmt(m.capture.trace_s)} | {_fmt(pool)} | {_fmt(peak)} | {_fmt(m.process.cell_s)} | {phases} | {kernels} | "
              + " | ".join(_fmt(m.latency.speedup.get(n)) for n in TOKENS)
              + f" | {_fmt(m.quant.quant_logprob_diff)} | {o.reason[:120]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
