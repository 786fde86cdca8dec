"""The dashboard at scale, over real HTTP: 10,000 cells × 30 runs in SQLite, on the 2-core machine.

Builds the database once through the Store (each run's 10,000 records in one Store.import_run, one transaction:
300,000 committed record_result calls would take most of an hour), then starts the dashboard as a user does,
`python -m web --db DB --port P` (uvicorn, one process, a random PCG_UPLOAD_TOKEN so that uploads are on), and
measures it with http.client over keep-alive connections, each GET sending `Accept-Encoding: gzip` as a
browser does and reading its body whole:

- /static/style.css first, to show what a request costs the client itself (its CPU per request);
- the first request of / right after the server starts, nothing warmed (target ≤ 1 s);
- every page and API endpoint (/, /runs, /cell, /diff, /runs/<id>, /requests, /api/runs, /api/runs/<id>,
  /api/matrix, /api/support, /api/cell, /api/diff, /api/requests, a badge), and /, /diff, /api/matrix and
  /api/diff with a query string never seen before on every request (what a client bypassing the page cache
  costs): the first request's time, the median of --repeat sequential requests after --warmup; then --clients
  clients (a thread and a connection each) for --duration s: req/s (completed / wall time), the median and p95
  latency under that load (targets: p95 ≤ 300 ms, ≥ 20 req/s), and the server's CPU per request (from /proc);
- --probes times, POST /api/runs declaring 30 MiB with no token, its body streamed in full as a stranger would,
  while one client keeps fetching GET /api/runs?limit=1: the time from the first byte sent to the refusal's
  status line (401/413), and those GETs' delay (their max and p90 during the POST minus their median before);
  after each POST a control window as long without one, so a stall of the server's own (a garbage collection
  of a big heap takes 0.1-0.5 s) can be told from a delay the POST caused.

- 1,100 half-open connections, then fresh GETs, all served; last, an authorized 200,000-cell upload (~45 MiB)
  while a client streams GETs: their p95 during it minus before (target ≤ 50 ms) — benchmarks/web_probes.py.

The targets are the constants below; the exit status is 0 only if all hold. --json PATH writes every number;
--env NAME=VALUE sets a variable in the server's environment (e.g. PCG_PAGE_CACHE_MB=0).

    python benchmarks/web_matrix.py                       # builds /tmp/pcg-web-bench.db if missing
    python benchmarks/web_matrix.py --json web_matrix.json --duration 10 --clients 10 --repeat 10
    python benchmarks/web_matrix.py --env PCG_PAGE_CACHE_MB=0           # the same server without its page cache
    python benchmarks/web_matrix.py --rebuild --cells 2000 --runs 5
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import platform
import random
import secrets
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import web_probes

from harness.metrics import CellMetrics
from harness.outcome import CellRecord, cell_key
from harness.store import Store

MAX_P95_MS = 300.0  # each page and API endpoint: p95 latency with --clients (10) concurrent clients
MIN_RPS = 20.0  # each page and API endpoint, with --clients (10) concurrent clients
MAX_COLD_MS = 1000.0  # the first request of / after the server starts, nothing warmed
MAX_UPLOAD_DELAY_MS = 50.0  # a 200,000-cell upload: p95 of concurrent GETs during it minus before
MAX_REFUSAL_MS = 50.0  # the unauthenticated 30 MiB POST: first byte sent → refusal received, worst of --probes
MAX_DELAY_MS = 50.0  # a GET alongside that POST: its worst latency minus its median before
PROBE_BYTES = 30 * 2**20
PROBE_GET = "/api/runs?limit=1"  # cheap, so a delay shows plainly on it
PROBE_TAIL_S = 0.25  # the server may still be reading the POST after its last byte went out: GETs that soon count
HEADERS = {"Accept-Encoding": "gzip", "User-Agent": "pcg-web-bench"}
REPO = Path(__file__).resolve().parents[1]

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
    start = datetime.now(UTC) - timedelta(days=n_runs)
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


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, -(-95 * len(xs) // 100) - 1)]  # nearest rank


def p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, -(-9 * len(xs) // 10) - 1)]  # nearest rank


class Server:
    """`python -m web` on a free port; its stderr to a temp file (a full pipe would stall it)."""

    def __init__(self, db: Path, env: dict[str, str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.token, self.stderr = secrets.token_urlsafe(24), tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "web", "--db", str(db), "--port", str(self.port)], cwd=REPO,
                                     env={**os.environ, **env, "PCG_UPLOAD_TOKEN": self.token},
                                     stdout=subprocess.DEVNULL, stderr=self.stderr)

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                get_json(self.conn(), "/api/runs?limit=1")
                return
            except (OSError, http.client.HTTPException):
                time.sleep(0.1)
        raise RuntimeError(f"the server exited with {self.proc.returncode}" if self.proc.returncode is not None
                           else f"the server did not answer within {timeout_s:.0f} s")

    def cpu_s(self) -> float:
        """The server's CPU time so far (user + system) from /proc; NaN without one."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, show_stderr: bool = False) -> None:
        """Terminates it; prints its stderr's tail if it died, or if asked (a request failed)."""
        died = self.proc.poll() is not None
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if died or show_stderr:
            self.stderr.seek(0)
            tail = self.stderr.read().decode(errors="replace").splitlines()[-30:]
            print(f"the server {'died' if died else 'ran'} (exit {self.proc.returncode}); its stderr ends:", *tail,
                  sep="\n  ", file=sys.stderr)


def fetch(conn: http.client.HTTPConnection, url: str, headers: dict[str, str] = HEADERS) -> bytes:
    """One GET, its body read whole (as sent: gzipped where the server gzips); a status other than 200 raises."""
    conn.request("GET", url, headers=headers)
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise RuntimeError(f"GET {url}: {r.status} {body[:200]!r}")
    return body


def get_json(conn: http.client.HTTPConnection, url: str) -> Any:
    return json.loads(fetch(conn, url, {}))  # no Accept-Encoding: plain JSON


def sequential(server: Server, url: str, warmup: int, repeat: int) -> dict[str, Any]:
    """The median of `repeat` requests after `warmup`; the first request's time is kept too (a cold cache's)."""
    conn, times, cpu0 = server.conn(), [], 0.0
    for i in range(warmup + repeat):
        if i == warmup:
            cpu0 = time.thread_time()
        t = time.perf_counter()
        size = len(fetch(conn, url))
        times.append(time.perf_counter() - t)
    cpu = (time.thread_time() - cpu0) / repeat
    conn.close()
    return {"bytes": size, "first_ms": ms(times[0]), "median_ms": ms(statistics.median(times[warmup:])),
            "client_cpu_ms": ms(cpu), "all_ms": [ms(t) for t in times[warmup:]]}


def load(server: Server, url: str, clients: int, duration: float) -> dict[str, Any]:
    """`clients` threads, a connection each, GET `url` until `duration` has passed; the requests then in flight
    finish and count, and the wall time runs to the last of them."""
    conns = [server.conn() for _ in range(clients)]
    for c in conns:
        c.connect()
    start: list[float] = []
    barrier = threading.Barrier(clients, action=lambda: start.append(time.perf_counter()))
    lat: list[float] = []
    ends: list[float] = []
    errors: list[str] = []

    def client(conn: http.client.HTTPConnection) -> None:
        barrier.wait()
        n = itertools.count()
        while time.perf_counter() < start[0] + duration:
            t = time.perf_counter()
            try:
                fetch(conn, url.replace("{n}", f"{threading.get_ident()}-{next(n)}"))  # {n}: a query never seen
            except (OSError, http.client.HTTPException, RuntimeError) as e:
                errors.append(str(e)[:200])
                conn.close()  # http.client reconnects on the next request
                continue
            ends.append(time.perf_counter())
            lat.append(ends[-1] - t)

    cpu0, srv0 = time.process_time(), server.cpu_s()
    threads = [threading.Thread(target=client, args=(c,)) for c in conns]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    n, wall = max(len(lat), 1), max(ends, default=time.perf_counter()) - start[0]
    return {"completed": len(lat), "errors": len(errors), "first_error": errors[0] if errors else None,
            "wall_s": round(wall, 3), "rps": round(len(lat) / wall, 2), "median_ms": ms(statistics.median(lat or [0])),
            "p90_ms": ms(p90(lat or [0])), "p95_ms": ms(p95(lat or [0])), "client_cpu_ms": ms((time.process_time() - cpu0) / n),
            "server_cpu_ms": ms((server.cpu_s() - srv0) / n)}


def post_unauthenticated(port: int, size: int) -> dict[str, Any]:
    """POST /api/runs declaring `size` bytes, no Authorization, the whole body sent while reading: the refusal
    time runs from the first byte sent to the status line arriving, or to the server closing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    chunk, got, sent = memoryview(b" " * 2**20), b"", 0
    answered: float | None = None
    closed: float | None = None
    t0 = time.perf_counter()
    sock.sendall(f"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {size}\r\n\r\n".encode())
    sock.setblocking(False)
    while closed is None and (sent < size or answered is None):
        readable, writable, _ = select.select([sock], [sock] if sent < size else [], [], 30)
        if not readable and not writable:
            break  # 30 s with the server neither reading nor answering
        if readable:
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            closed = None if data else time.perf_counter()
            got += data
            answered = answered or (time.perf_counter() if b"\r\n" in got else None)
        if writable and closed is None:
            try:
                sent += sock.send(chunk[: size - sent])
            except ConnectionError:  # a broken pipe: the server closed while the body was going out
                closed = time.perf_counter()
    t_end = time.perf_counter()
    if answered is None:
        try:  # a refusal sent just before the server closed may still be waiting
            got += sock.recv(65536)
        except OSError:
            pass
    sock.close()
    line = got.split(b"\r\n", 1)[0].decode(errors="replace")
    refused = answered or closed
    return {"status": int(line.split()[1]) if line.startswith("HTTP/") else None, "status_line": line,
            "refusal_ms": ms(refused - t0) if refused else None, "body_sent_bytes": sent,
            "server_closed": closed is not None, "send_ms": ms(t_end - t0), "window": (t0, t_end)}


def upload_probe(server: Server, probes: int, baseline_s: float = 2.5) -> dict[str, Any]:
    # With uploads off, the probe would only show the "uploads are disabled" refusal: the right token and an
    # empty body must get as far as validation (422).
    conn = server.conn()
    conn.request("POST", "/api/runs", b"{}",
                 {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"})
    if (status := conn.getresponse().status) != 422:
        raise RuntimeError(f"POST /api/runs with the token and an empty body: {status}, expected 422")
    conn.close()
    stop, gets = threading.Event(), list[tuple[float, float]]()

    def stream() -> None:
        c = server.conn()
        while not stop.is_set():
            t = time.perf_counter()
            fetch(c, PROBE_GET)
            gets.append((t, time.perf_counter()))

    th = threading.Thread(target=stream)
    t_start = time.perf_counter()
    th.start()
    time.sleep(baseline_s)
    t_base = time.perf_counter()
    posts, windows, controls = [], [], []
    for _ in range(probes):
        posts.append(post_unauthenticated(server.port, PROBE_BYTES))
        w0, w1 = posts[-1].pop("window")
        windows.append((w0, w1 + PROBE_TAIL_S))
        time.sleep(PROBE_TAIL_S + 0.25)
        # A control: a window as long, without the POST, so a stall of the server's own (a garbage collection)
        # can be told from a delay the POST caused.
        c0 = time.perf_counter()
        time.sleep(w1 + PROBE_TAIL_S - w0)
        controls.append((c0, time.perf_counter()))
        time.sleep(0.25)
    stop.set()
    th.join()
    base = [e - s for s, e in gets if s >= t_start + 0.5 and e <= t_base]  # the stream's first 0.5 s as warm-up
    base_med = statistics.median(base)

    def overlapping(ws: list[tuple[float, float]]) -> dict[str, float]:
        xs = [e - s for s, e in gets if any(s < b and e > a for a, b in ws)]
        return {"n": len(xs), "median_ms": ms(statistics.median(xs)), "p90_ms": ms(p90(xs)), "max_ms": ms(max(xs)),
                "delay_p90_ms": ms(p90(xs) - base_med), "delay_max_ms": ms(max(xs) - base_med)}

    refusals = [p["refusal_ms"] if p["refusal_ms"] is not None else float("inf") for p in posts]
    return {"get": PROBE_GET, "posts": posts, "statuses": sorted({p["status"] for p in posts}, key=str),
            "refusal_median_ms": statistics.median(refusals), "refusal_max_ms": max(refusals),
            "before": {"n": len(base), "median_ms": ms(base_med), "p90_ms": ms(p90(base)), "max_ms": ms(max(base))},
            "during": overlapping(windows), "control": overlapping(controls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", type=Path, default=Path("/tmp/pcg-web-bench.db"))
    p.add_argument("--cells", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--rebuild", action="store_true", help="delete and rebuild the database")
    p.add_argument("--warmup", type=int, default=2, help="sequential requests before the timed ones")
    p.add_argument("--repeat", type=int, default=10, help="sequential requests timed per page")
    p.add_argument("--clients", type=int, default=10, help="concurrent clients for req/s")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of concurrent load per page")
    p.add_argument("--probes", type=int, default=5, help="unauthenticated 30 MiB POSTs")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in the server's environment (repeatable), e.g. PCG_PAGE_CACHE_MB=0")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    if args.rebuild:
        args.db.unlink(missing_ok=True)
    if not args.db.exists():
        print(f"building {args.db}: {args.cells} cells × {args.runs} runs")
        t = time.perf_counter()
        build(args.db, args.cells, args.runs)
        print(f"built in {time.perf_counter() - t:.1f} s ({args.db.stat().st_size / 2**20:.0f} MiB)")
    env = dict(e.split("=", 1) for e in args.env)
    server, failed = Server(args.db, env), True
    try:
        server.wait_ready()
        t = time.perf_counter()  # before anything else asks for a page: nothing is warmed
        fetch(server.conn(), "/")
        cold_ms = ms(time.perf_counter() - t)
        print(f"cold first request of /: {cold_ms:.0f} ms", flush=True)
        runs = get_json(server.conn(), "/api/runs?limit=10000")["runs"]
        git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
        meta = {"db": str(args.db), "db_mib": round(args.db.stat().st_size / 2**20), "runs": len(runs),
                "cells": runs[0]["cells"], "git": git.stdout.strip(), "python": platform.python_version(),
                "cpus": os.cpu_count(), "server_env": env,
                "when": datetime.now(UTC).isoformat(timespec="seconds")}
        latest = runs[0]["run"]["id"]
        query = urlencode({"model": "model-000:trim:4", "graph": "piecewise"})
        key = get_json(server.conn(), f"/api/matrix?{query}")["cells"][0]["key"]
        print(f"python -m web on :{server.port} over {args.db} ({meta['cells']} cells × {meta['runs']} runs), "
              f"{meta['cpus']} CPUs, {meta['git']}" + "".join(f", {k}={v}" for k, v in env.items()), flush=True)
        calib = {"sequential": sequential(server, "/static/style.css", 20, 200),
                 "load": load(server, "/static/style.css", args.clients, args.duration)}
        calib["sequential"].pop("all_ms")
        print(f"client check, /static/style.css: {calib['sequential']['median_ms']} ms a round trip; the client's "
              f"CPU {calib['sequential']['client_cpu_ms']} ms/request alone, {calib['load']['client_cpu_ms']} ms/request"
              f" at {args.clients} clients ({calib['load']['rps']:.0f} req/s)", flush=True)
        pages: list[dict[str, Any]] = []
        cell = urlencode({"key": key})
        # Every page and API endpoint; "?q={n}" asks each time with a query string never seen before (so no page
        # cache can answer it: what a client bypassing the cache costs)
        endpoints = [("/", "/"), ("/?q", "/?q={n}"), ("/runs", "/runs"), ("/cell", f"/cell?{cell}"),
                     ("/diff", "/diff"), ("/diff?q", "/diff?q={n}"), (f"/runs/{latest}", f"/runs/{latest}"),
                     ("/requests", "/requests"), ("/api/runs", "/api/runs"), (f"/api/runs/{latest}", f"/api/runs/{latest}"),
                     ("/api/matrix", "/api/matrix"), ("/api/matrix?q", "/api/matrix?q={n}"), ("/api/support", "/api/support"),
                     ("/api/cell", f"/api/cell?{cell}"), ("/api/diff", "/api/diff"), ("/api/diff?q", "/api/diff?q={n}"),
                     ("/api/requests", "/api/requests"), ("/badge", "/badge/matrix/nightly.svg")]
        for page, url, target in ((p_, u_, True) for p_, u_ in endpoints):
            try:
                seq = sequential(server, url.replace("{n}", "seq"), args.warmup, args.repeat)
            except RuntimeError as e:  # a 500: this page fails, the others are still measured
                pages.append({"page": page, "url": url, "target": target, "pass": False, "error": str(e)})
                print(f"  {page}: {e}", flush=True)
                continue
            under = load(server, url, args.clients, args.duration)
            ok = under["p95_ms"] <= MAX_P95_MS and under["rps"] >= MIN_RPS and not under["errors"]
            pages.append({"page": page, "url": url, "target": target, "pass": ok, "sequential": seq, "load": under})
            print(f"  {page}: {seq['median_ms']:.0f} ms, {under['rps']} req/s", flush=True)
        probe = upload_probe(server, args.probes)
        print("1,100 half-open connections …", flush=True)
        slow = web_probes.half_open(server.port, PROBE_GET)
        print(f"a {web_probes.BIG_CELLS:,}-cell upload …", flush=True)
        big = web_probes.big_upload(server.port, server.token, PROBE_GET)  # last: it adds a run
        failed = any("error" in r or r["load"]["errors"] for r in pages)
    finally:
        server.stop(show_stderr=failed)
    refusal_ok = probe["refusal_max_ms"] <= MAX_REFUSAL_MS and set(probe["statuses"]) <= {401, 413}
    delay_ok = probe["during"]["delay_max_ms"] <= MAX_DELAY_MS
    verdict = {True: "PASS", False: "FAIL"}

    print(f"\n{'page':<16}{'KiB sent':>9}{'first':>9}{'seq median':>12}{f'req/s @{args.clients}':>12}"
          f"{'load med/p95':>17}{'server CPU/req':>16}  target")
    for r in pages:
        if "error" in r:
            print(f"{r['page']:<16}{r['error']}  {verdict[False] if r['target'] else '(context)'}")
            continue
        s, u = r["sequential"], r["load"]
        aim = f"p95 ≤{MAX_P95_MS:.0f} ms, ≥{MIN_RPS:.0f} req/s  {verdict[r['pass']]}" if r["target"] else "(context)"
        busy = f"{u['median_ms']:.0f}/{u['p95_ms']:.0f} ms"
        errors = f"  ({u['errors']} errors: {u['first_error']})" if u["errors"] else ""
        print(f"{r['page']:<16}{s['bytes'] / 1024:>9.0f}{s['first_ms']:>6.0f} ms{s['median_ms']:>9.0f} ms"
              f"{u['rps']:>12.1f}{busy:>17}{u['server_cpu_ms']:>13.0f} ms  {aim}{errors}")
    q = probe
    print(f"POST /api/runs, {PROBE_BYTES >> 20} MiB, no token, ×{args.probes}: {'/'.join(map(str, q['statuses']))} in "
          f"{q['refusal_median_ms']:.1f} ms median, {q['refusal_max_ms']:.1f} max  target ≤{MAX_REFUSAL_MS:.0f} ms  "
          f"{verdict[refusal_ok]}")
    d, c = q["during"], q["control"]
    print(f"GET {PROBE_GET} alongside: {q['before']['median_ms']:.1f} ms median before; during the POSTs "
          f"{d['median_ms']:.1f} median, {d['p90_ms']:.1f} p90, {d['max_ms']:.1f} max (n={d['n']}): delay p90 "
          f"{d['delay_p90_ms']:+.1f} ms, max {d['delay_max_ms']:+.1f} ms  target ≤{MAX_DELAY_MS:.0f} ms  "
          f"{verdict[delay_ok]}")
    print(f"  control, windows as long without a POST: {c['median_ms']:.1f} median, {c['p90_ms']:.1f} p90, "
          f"{c['max_ms']:.1f} max (n={c['n']}): delay p90 {c['delay_p90_ms']:+.1f} ms, max {c['delay_max_ms']:+.1f} ms")
    cold_ok = cold_ms <= MAX_COLD_MS
    slow_ok = slow["errors"] == 0 and slow["max_ms"] < 10_000
    big_ok = big["status"] == 201 and big["delay_p95_ms"] <= MAX_UPLOAD_DELAY_MS
    print(f"cold first request of /: {cold_ms:.0f} ms  target ≤{MAX_COLD_MS:.0f} ms  {verdict[cold_ok]}")
    print(f"{slow['open']} half-open connections held: {slow['requests']} fresh GETs, {slow['errors']} errors, "
          f"median {slow['median_ms']:.0f} ms, max {slow['max_ms']:.0f} ms  target all served  {verdict[slow_ok]}")
    print(f"{big['cells']:,}-cell upload ({big['mib']} MiB): {big['status']} in {big['upload_s']} s; GET {PROBE_GET} p95 "
          f"{big['before']['p95_ms']:.1f} ms before (n={big['before']['n']}), {big['during']['p95_ms']:.1f} ms during "
          f"(n={big['during']['n']}, max {big['during']['max_ms']:.0f}): +{big['delay_p95_ms']:.1f} ms  target "
          f"≤{MAX_UPLOAD_DELAY_MS:.0f} ms  {verdict[big_ok]}")
    ok = all(r["pass"] for r in pages if r["target"]) and refusal_ok and delay_ok and cold_ok and slow_ok and big_ok
    if args.json:
        targets = {"max_p95_ms": MAX_P95_MS, "min_rps": MIN_RPS, "clients": args.clients, "max_cold_ms": MAX_COLD_MS,
                   "max_refusal_ms": MAX_REFUSAL_MS, "max_delay_ms": MAX_DELAY_MS,
                   "max_upload_delay_ms": MAX_UPLOAD_DELAY_MS}
        args.json.write_text(json.dumps({"meta": meta, "targets": targets, "client_check": calib, "cold_ms": cold_ms,
                                         "pages": pages, "upload_probe": probe, "half_open": slow, "big_upload": big,
                                         "pass": ok}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
