"""Probes of the dashboard under hostile load, for benchmarks/web_matrix.py (one file per concern):

- big_upload: an authorized nightly-scale upload (200,000 cells, ~45 MiB) POSTed while one client keeps fetching
  a cheap GET; the GETs' p95 during the upload minus their p95 before is the delay the upload caused (target
  ≤ 50 ms: the upload is parsed and written in the server's upload worker process, web/uploads.py);
- half_open: 1,100 connections that send half a request's headers and stop, then a fresh client's GETs: all
  must be served (web/server.py closes the slow ones at their deadline).
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time
from typing import Any

from harness.outcome import cell_key

BIG_CELLS = 200_000
HALF_OPEN = 1_100


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, -(-95 * len(xs) // 100) - 1)]  # nearest rank


def ms(s: float) -> float:
    return round(s * 1000, 1)


def big_run_body(n: int) -> bytes:
    """A run of `n` minimal cells (~230 bytes each), every key the one its axes give, so the upload is accepted
    (201) — and under the server's 64 MiB cap."""
    quants, graphs = ("none", "fp8_block", "int8_w8a8", "awq"), ("piecewise", "breakable", "full")
    attentions, parallels = ("sdpa", "flex", "varlen"), ("tp1", "tp2")
    per_model = len(quants) * len(graphs) * len(attentions) * len(parallels)
    results = []
    for i in range(n):
        m, r = divmod(i, per_model)
        q, r = divmod(r, len(graphs) * len(attentions) * len(parallels))
        g, r = divmod(r, len(attentions) * len(parallels))
        a, p = divmod(r, len(parallels))
        axes = {"model": f"u{m}:tiny", "quant": quants[q], "attention": attentions[a], "parallel": parallels[p],
                "graph": graphs[g], "compiler": "eager"}  # kv_cache left at its default, as older writers do
        results.append({"key": cell_key(axes), "axes": axes, "status": "pass"})
    run = {"name": "big-upload", "matrix": "nightly.yaml", "trigger": "nightly", "started_at": "2026-01-01T02:00:00Z",
           "finished_at": "2026-01-01T03:00:00Z", "results": results}
    return json.dumps(run).encode()


def _stream(port: int, url: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while not stop.is_set():
        t = time.perf_counter()
        conn.request("GET", url)
        r = conn.getresponse()
        r.read()
        out.append((t, time.perf_counter()))


def big_upload(port: int, token: str, get: str, cells: int = BIG_CELLS, baseline_s: float = 3.0) -> dict[str, Any]:
    """POST a `cells`-cell run with the token while a client streams GET `get`; the GETs before and during."""
    body = big_run_body(cells)
    stop, gets = threading.Event(), list[tuple[float, float]]()
    th = threading.Thread(target=_stream, args=(port, get, stop, gets))
    t_start = time.perf_counter()
    th.start()
    time.sleep(baseline_s)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/api/runs", body, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    r = conn.getresponse()
    answer = r.read()
    t1 = time.perf_counter()
    stop.set()
    th.join()
    before = [e - s for s, e in gets if s >= t_start + 0.5 and e <= t0]
    during = [e - s for s, e in gets if s < t1 and e > t0]
    out = {"cells": cells, "mib": round(len(body) / 2**20, 1), "status": r.status, "answer": answer[:200].decode(errors="replace"),
           "upload_s": round(t1 - t0, 2), "before": {"n": len(before), "p95_ms": ms(p95(before or [0]))},
           "during": {"n": len(during), "p95_ms": ms(p95(during or [0])), "max_ms": ms(max(during or [0]))}}
    out["delay_p95_ms"] = round(out["during"]["p95_ms"] - out["before"]["p95_ms"], 1)
    return out


def half_open(port: int, get: str, n: int = HALF_OPEN, requests: int = 20) -> dict[str, Any]:
    """Open `n` connections that each send half a request's headers, then time `requests` fresh GETs."""
    slow: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\n")  # the headers never end
            slow.append(s)
        times, errors = [], []
        for _ in range(requests):
            t = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", get)
                r = conn.getresponse()
                r.read()
                conn.close()
                if r.status != 200:
                    errors.append(str(r.status))
            except OSError as e:
                errors.append(str(e)[:100])
            times.append(time.perf_counter() - t)
        return {"open": len(slow), "requests": requests, "errors": len(errors), "first_error": errors[0] if errors else None,
                "median_ms": ms(statistics.median(times)), "max_ms": ms(max(times))}
    finally:
        for s in slow:
            s.close()
