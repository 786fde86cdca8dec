"""A restarted dashboard's first requests, with and without the runs' aggregates kept in the store (issue 41).

Over web_matrix.py's database (30 runs × 10,000 cells, SQLite), page cache off: the server is started as a user
starts it (`python -m web`), and the first GET of each page is timed (nothing warmed but the readiness probe's
/api/runs?limit=1). Two starts per round, side by side: `empty` after the run_aggregates rows are deleted (a server
whose aggregates nobody has computed yet: what every start cost before they were kept), then `kept` (the rows the
first server wrote on its way). Medians over --rounds rounds; the ratio is empty / kept.

    python benchmarks/web_restart.py [--db /tmp/pcg-web-bench.db] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from web_matrix import Server, fetch  # noqa: E402

PAGES = ("/", "/api/support", "/requests", "/api/requests", "/runs/30")


def first_requests(db: Path) -> dict[str, float]:
    server = Server(db, {"PCG_PAGE_CACHE_MB": "0"})
    try:
        server.wait_ready()
        out = {}
        for url in PAGES:
            conn = server.conn()
            t0 = time.perf_counter()
            fetch(conn, url)
            out[url] = (time.perf_counter() - t0) * 1e3
        return out
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", type=Path, default=Path("/tmp/pcg-web-bench.db"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if not a.db.exists():
        sys.exit(f"{a.db}: build it first (python benchmarks/web_matrix.py --rebuild)")
    times: dict[str, dict[str, list[float]]] = {"empty": {u: [] for u in PAGES}, "kept": {u: [] for u in PAGES}}
    for r in range(a.rounds):
        with sqlite3.connect(a.db) as conn:
            conn.execute("DELETE FROM run_aggregates") if conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name='run_aggregates'").fetchone() else None
        for mode in ("empty", "kept"):
            for url, ms in first_requests(a.db).items():
                times[mode][url].append(ms)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    med = {m: {u: statistics.median(v) for u, v in t.items()} for m, t in times.items()}
    print(f"first request after a start, ms (median of {a.rounds}; page cache off; {a.db.name})")
    print(f"{'page':16} {'empty':>8} {'kept':>8} {'empty/kept':>10}")
    for u in PAGES:
        print(f"{u:16} {med['empty'][u]:8.1f} {med['kept'][u]:8.1f} {med['empty'][u] / med['kept'][u]:10.2f}")
    if a.json:
        a.json.write_text(json.dumps({"rounds": a.rounds, "times_ms": times, "median_ms": med}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
