"""Markdown table of `pcgh cell --json` lines (one JSON object per line)."""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    print("| model | layers | graph | status | token match | max Δlogprob prompt | max Δlogprob output | "
          "capture s | trace s | pool MiB | speedup @8 | @128 | @512 | @2048 | reason |")
    print("|---" * 15 + "|")
    for r in rows:
        sp = r.get("speedup", {})
        fmt = lambda v: f"{v:.3g}" if isinstance(v, (int, float)) else "–"  # noqa: E731
        print(f"| {r['model']} | {r['layers']} | {r['graph']} | {r['status']} | {fmt(r['token_match'])} | "
              f"{fmt(r['max_prompt_logprob_diff'])} | {fmt(r['max_output_logprob_diff'])} | {fmt(r['capture_s'])} | "
              f"{fmt(r.get('trace_s'))} | {r['graph_pool_bytes'] / 2**20:.0f} | "
              + " | ".join(fmt(sp.get(n)) for n in ("8", "128", "512", "2048"))
              + f" | {r['reason'][:120]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
