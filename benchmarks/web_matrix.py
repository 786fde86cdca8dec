"""How long the dashboard's matrix page takes for a big store: 10,000 cells × 30 runs in SQLite.

Builds the database once through the Store (each run with its 10,000 records in one Store.import_run, one
transaction, since 300,000 committed record_result calls would take most of an hour), then times GET / (the
latest run's matrix, no filters) through FastAPI's TestClient: warm-up requests first, then the median of --repeat.
Also times a cell page, the runs page and /api/matrix for context. Target: the matrix under 1 s on the
2-core CI machine.

    python benchmarks/web_matrix.py                       # builds /tmp/pcg-web-bench.db if missing
    python benchmarks/web_matrix.py --rebuild --cells 2000 --runs 5
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from harness.outcome import CellMetrics, CellRecord, cell_key
from harness.store import Store

# 50 models × 2 quant × 5 attention × 5 parallel × 2 graph × 2 compiler = 10,000 cells.
AXIS_VALUES = {
    "quant": ("none", "fp8"),
    "attention": ("sdpa", "flash", "flashinfer", "triton", "mla"),
    "parallel": ("tp1", "tp2", "tp4", "tp8", "ep8"),
    "graph": ("piecewise", "breakable"),
    "compiler": ("eager", "inductor"),
}
STATUS_WEIGHTS = {"pass": 80, "pass_flaky": 3, "fail_accuracy": 4, "fail_capture": 3, "fail_run": 2, "timeout": 1,
                  "oom": 1, "eager_fail": 1, "unsupported": 4, "skipped": 1}
TOKENS = ("8", "32", "128", "512", "2048")


def cells(n: int) -> list[dict[str, str]]:
    per_model = 1
    for v in AXIS_VALUES.values():
        per_model *= len(v)
    models = [f"model-{i:03d}:{'tiny' if i % 3 else 'trim:4'}" for i in range((n + per_model - 1) // per_model)]
    combos = itertools.product(models, *AXIS_VALUES.values())
    return [dict(zip(("model", *AXIS_VALUES), c)) for c in itertools.islice(combos, n)]


def metrics(rng: random.Random, status: str) -> CellMetrics:
    """A cell's metrics, full size (~1 kB of JSON)."""
    m: dict[str, Any] = {"device": "cuda", "dtype": "bfloat16", "layers": 4, "tiny": False, "max_tokens": 2048,
                         "pieces": 9, "graphs_captured": 450, "trace_s": rng.uniform(1, 3), "capture_s": rng.uniform(2, 9),
                         "compile_s": 0.0, "graph_pool_bytes": rng.randint(100, 900) * 2**20, "eager_fallbacks": 0,
                         "token_match": 1.0, "max_prompt_logprob_diff": rng.uniform(0, 0.05),
                         "max_output_logprob_diff": rng.uniform(0, 0.05), "topk_containment_ok": True,
                         "divergences": [], "eager_bitwise_deterministic": True, "max_prompt_kl": rng.uniform(0, 1e-3),
                         "bucket_hits": {str(b): rng.randint(0, 9) for b in (4, 8, 16, 32, 64, 128, 256, 512)}}
    if status in ("pass", "pass_flaky"):
        lat = {t: {"eager": round(rng.uniform(20, 40), 4), "graph": round(rng.uniform(4, 12), 4)} for t in TOKENS}
        m["latency_ms"] = lat
        m["speedup"] = {t: round(v["eager"] / v["graph"], 3) for t, v in lat.items()}
    return CellMetrics.model_validate(m)


def build(db: Path, n_cells: int, n_runs: int, seed: int = 0) -> None:
    """Each run through Store.import_run: its records in one transaction, with its own start and finish times."""
    rng = random.Random(seed)
    grid = cells(n_cells)
    keys = [cell_key(a) for a in grid]
    statuses, weights = list(STATUS_WEIGHTS), list(STATUS_WEIGHTS.values())
    start = datetime.now(timezone.utc) - timedelta(days=n_runs)
    t0 = time.perf_counter()
    with Store(str(db)) as store:
        for r in range(n_runs):
            records = []
            for k, a in zip(keys, grid):
                status = rng.choices(statuses, weights)[0]
                records.append(CellRecord(
                    key=k, axes=a, status=status, reason="" if status == "pass" else f"{status}: synthetic reason for {k}",
                    metrics=CellMetrics() if status in ("unsupported", "skipped") else metrics(rng, status),
                    log=f"cell {k}\n" + "log line\n" * 20, duration_s=rng.uniform(5, 60)))
            began = start + timedelta(days=r)
            store.import_run("nightly", "harness/configs/nightly.yaml",
                             {"git_sha": f"{r:040x}", "gpu_name": "NVIDIA H200", "host": "gpu-01"}, records,
                             trigger="nightly", started_at=began, finished_at=began + timedelta(hours=2))
            print(f"  run {r + 1}/{n_runs}: {len(records)} cells ({time.perf_counter() - t0:.0f} s)", flush=True)


def timed(client: Any, url: str, warmup: int, repeat: int) -> tuple[float, int]:
    for _ in range(warmup):
        client.get(url)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - t)
        r.raise_for_status()
    return statistics.median(times), len(r.content)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", type=Path, default=Path("/tmp/pcg-web-bench.db"))
    p.add_argument("--cells", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--rebuild", action="store_true", help="delete and rebuild the database")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    if args.rebuild:
        args.db.unlink(missing_ok=True)
    if not args.db.exists():
        print(f"building {args.db}: {args.cells} cells × {args.runs} runs")
        t = time.perf_counter()
        build(args.db, args.cells, args.runs)
        print(f"built in {time.perf_counter() - t:.1f} s ({args.db.stat().st_size / 2**20:.0f} MiB)")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from fastapi.testclient import TestClient

    from web.app import create_app

    with TestClient(create_app(str(args.db))) as client:
        latest = client.get("/api/runs?limit=1").json()["runs"][0]["run"]["id"]
        key = client.get("/api/matrix", params={"model": "model-000:trim:4", "graph": "piecewise"}).json()["cells"][0]["key"]
        med, size = timed(client, "/", args.warmup, args.repeat)
        print(f"matrix page GET / (run {latest}, {args.cells} cells): median {med * 1000:.0f} ms "
              f"of {args.repeat} after {args.warmup} warm-up, {size / 2**20:.2f} MiB of HTML")
        for label, url in (("filtered matrix (graph=piecewise, status=failing)", "/?graph=piecewise&status=failing"),
                           ("/api/matrix", "/api/matrix"), ("cell page", f"/cell?key={key}"), ("runs page", "/runs"),
                           (f"run page /runs/{latest}", f"/runs/{latest}"), ("diff page", "/diff")):
            m, s = timed(client, url, 1, 3)
            print(f"  {label}: median {m * 1000:.0f} ms, {s / 1024:.0f} KiB")
    return 0 if med < 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
