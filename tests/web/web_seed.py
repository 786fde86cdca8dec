"""A small results database for the dashboard tests, written through the Store's import_run (as an upload is).

Three runs of four models × three capture backends × two attention backends (24 cells each):

- run 1 and run 2: "nightly" (trigger nightly), so the newest nightly is run 2, and stale;
- run 3: "smoke" (manual), the latest run.

Every run gets fixed start and finish times (in January 2026), so pages and screenshots do not change with
the clock, apart from the stale nightly's age.

Planted on purpose: a cell that flips pass → fail_accuracy → pass (flaky by its history); a cell passing only
on retry in run 3 (attempts 1 and 2); a new failure in run 3 (mixtral full: pass → fail_capture); a log with a
<script> in it; an unsupported and an eager_fail cell (not counted); a trim:4 model (repro needs --layers 4).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta, UTC
from typing import Any

from harness.metrics import CellMetrics
from harness.outcome import CellRecord, cell_key
from harness.store import Store

MODELS = ("qwen3-0.6b:tiny", "llama-3.1-8b:tiny", "mixtral-8x7b:tiny", "qwen3-8b:trim:4")
GRAPHS = ("piecewise", "breakable", "full")
ATTENTIONS = ("sdpa", "flash")
SCRIPT_LOG = 'loading model\n<script>window.__pwned = 1; alert("pwned")</script>\n<img src=x onerror="window.__pwned=2">\ndone\n'
T0 = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)


def axes(model: str, graph: str, attention: str = "sdpa") -> dict[str, str]:
    return {"model": model, "quant": "none", "attention": attention, "parallel": "tp1", "graph": graph,
            "compiler": "eager", "kv_cache": "auto", "engine": "pcg"}


def key(model: str, graph: str, attention: str = "sdpa") -> str:
    return cell_key(axes(model, graph, attention))


def metrics(model: str, graph: str, attention: str, run: int, passed: bool = True) -> CellMetrics:
    """What a cell measures, trimmed: settings, capture stats, latencies, speedups per token count."""
    base = 1.5 + 0.25 * GRAPHS.index(graph) + 0.1 * run + 0.05 * MODELS.index(model) + 0.3 * ATTENTIONS.index(attention)
    m: dict[str, Any] = {"device": "cpu", "dtype": "float32", "tiny": model.endswith(":tiny"), "layers": 2,
                         "max_tokens": 64, "pieces": 5, "graphs_captured": 10, "trace_s": 0.5,
                         "capture_s": 0.8 + 0.1 * run, "compile_s": 0.0, "graph_pool_bytes": (4 + run) * 2**20,
                         "token_match": 1.0 if passed else 0.75, "eager_fallbacks": 0}
    if passed:
        m["speedup"] = {"8": round(base, 3), "32": round(base * 1.2, 3)}
        m["latency_ms"] = {"8": {"eager": 10.0, "graph": round(10 / base, 4)},
                           "32": {"eager": 12.0, "graph": round(12 / (base * 1.2), 4)}}
    return CellMetrics.model_validate(m)


# (model, graph, attention) -> status per run 1..3; every other cell passes in every run.
PLAN: dict[tuple[str, str, str], tuple[str, str, str]] = {
    ("qwen3-0.6b:tiny", "breakable", "sdpa"): ("pass", "fail_accuracy", "pass"),
    ("mixtral-8x7b:tiny", "full", "sdpa"): ("pass", "pass", "fail_capture"),
    ("llama-3.1-8b:tiny", "full", "sdpa"): ("unsupported", "unsupported", "unsupported"),
    ("llama-3.1-8b:tiny", "full", "flash"): ("unsupported", "unsupported", "unsupported"),
    ("qwen3-8b:trim:4", "full", "sdpa"): ("eager_fail", "eager_fail", "eager_fail"),
    ("llama-3.1-8b:tiny", "breakable", "sdpa"): ("pass", "pass", "pass_flaky"),
    ("qwen3-8b:trim:4", "piecewise", "flash"): ("timeout", "timeout", "timeout"),
    ("mixtral-8x7b:tiny", "breakable", "flash"): ("oom", "pass", "pass"),
}
REASONS = {"fail_accuracy": "prompt logprob diff 0.31 > 0.001", "fail_capture": "RuntimeError: capture failed in piece 3",
           "unsupported": "full graph: sliding-window attention is not supported", "eager_fail": "eager forward raised",
           "pass_flaky": "passed on retry; first attempt: fail_run: segfault", "timeout": "no result after 300 s",
           "oom": "CUDA out of memory. Tried to allocate 2.00 GiB"}
NO_METRICS = ("unsupported", "eager_fail", "timeout")  # the cell died or never ran: run_cell recorded nothing
SCRIPT_CELL = ("qwen3-0.6b:tiny", "piecewise", "sdpa")


@dataclass
class Seeded:
    url: str
    run_ids: list[int] = field(default_factory=list)

    @property
    def latest(self) -> int:
        return self.run_ids[-1]


def seed(url: str) -> Seeded:
    """Write the three runs into the (empty) database at url."""
    out = Seeded(url)
    with Store(url) as store:
        for i, (name, trigger) in enumerate((("nightly", "nightly"), ("nightly", "nightly"), ("smoke", "manual")), 1):
            meta = {"git_sha": f"{i:040x}", "torch_version": "2.13.0", "transformers_version": "5.17.0",
                    "gpu_name": "NVIDIA H200" if i < 3 else None, "host": f"host-{i}"}
            records = []
            for model, graph, attention in itertools.product(MODELS, GRAPHS, ATTENTIONS):
                cell = (model, graph, attention)
                status = PLAN.get(cell, ("pass",) * 3)[i - 1]
                record = CellRecord(key=key(*cell), axes=axes(*cell), status=status, reason=REASONS.get(status, ""),
                                    duration_s=3.0, log=SCRIPT_LOG if cell == SCRIPT_CELL else f"log of {key(*cell)} run {i}\n",
                                    metrics=CellMetrics() if status in NO_METRICS
                                    else metrics(*cell, i, status in ("pass", "pass_flaky")))
                if status == "pass_flaky":
                    first = {**dict(record), "status": "fail_run", "reason": "segfault", "metrics": CellMetrics()}
                    records.append(CellRecord(**first))
                    record = CellRecord(**{**dict(record), "attempt": 2})
                records.append(record)
            start = T0 + timedelta(days=i)
            out.run_ids.append(store.import_run(name, f"harness/configs/{name}.yaml", meta, records, trigger=trigger,
                                                started_at=start, finished_at=start + timedelta(minutes=40 + i)))
    return out
