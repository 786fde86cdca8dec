"""One attempt of a cell that runs as several processes, one per rank (a parallel mode: pcg_core.known.world_size).

Every rank is the same cell worker (`python -m harness.launcher.worker`, the spec on stdin), which calls
`run_cell(spec)`; what makes it a rank is its environment, torch's env:// rendezvous:

    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE   this rank, of WORLD_SIZE, all on this host
    MASTER_ADDR=127.0.0.1, MASTER_PORT               a free port of this host, one per cell
    CUDA_VISIBLE_DEVICES                             the cell's k GPUs, the same list on every rank (CUDA cells)
    OMP_NUM_THREADS=1                                CPU cells, unless the environment sets it

Each rank is a worker of its own for groups.py (a session, a token, a record), so a crash or a hang of any rank
is seen, and every rank's group is killed when the cell ends. A rank that exits nonzero ends the cell at once:
the others would wait for it in a collective until the timeout. The cell's outcome is rank 0's; another rank's
status, where it differs, is said in the reason (and a pass must be every rank's pass).

Each rank's output goes to a file of its own while it runs (`<log>.rank<r>.log`), and into the cell's log,
each line prefixed `[rank r]`, when the cell ends.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from harness.launcher.classify import classify_death
from harness.launcher.groups import RankEnd, WorkerGroups
from harness.matrix import Cell
from harness.outcome import PASSING, CellOutcome

MASTER_ADDR = "127.0.0.1"
WORKER = ["-m", "harness.launcher.worker"]  # after the interpreter; tests plant a worker of their own here
_ports_lock = threading.Lock()
_ports_held: set[int] = set()  # handed to a live cell of this runner: never given to another at the same time


def reserve_port() -> int:
    """A free TCP port of this host for a cell's rendezvous, not handed to another live cell of this process."""
    with _ports_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((MASTER_ADDR, 0))
                port = s.getsockname()[1]
            if port not in _ports_held:
                _ports_held.add(port)
                return port
    raise OSError("no free TCP port for the cell's rendezvous after 100 tries")


def release_port(port: int) -> None:
    with _ports_lock:
        _ports_held.discard(port)


def rank_env(base: dict[str, str], rank: int, world: int, port: int, gpus: Sequence[int] | None) -> dict[str, str]:
    """The environment of one rank: torch's env:// variables, the cell's GPUs (CUDA) or one thread (CPU)."""
    env = {**base, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": str(port)}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus, base)
    else:
        env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share the cores a one-rank cell would have
    return env


def visible_devices(gpus: Sequence[int], env: dict[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES for a worker given GPUs `gpus`, indices as this process sees them: through the
    environment's own CUDA_VISIBLE_DEVICES when it sets one (a runner pinned to GPUs 2,3 hands out those)."""
    seen = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return ",".join(seen[g] if g < len(seen) else str(g) for g in gpus)


def rank_path(log_path: Path, rank: int, suffix: str) -> Path:
    return log_path.with_suffix(f".rank{rank}{suffix}")


def merged_log(texts: list[str], header: str) -> str:
    """The cell's log: a line saying how each rank ended, then each rank's lines prefixed `[rank r]`."""
    out = [header]
    for r, text in enumerate(texts):
        out += [f"[rank {r}] {line}" for line in text.splitlines()]
    return "\n".join(out) + "\n"


def _end_words(end: RankEnd) -> str:
    if end.killed_after is not None:
        return f"killed after rank {end.killed_after} ended"
    if end.timed_out:
        return "still running at the timeout, killed"
    if end.returncode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-end.returncode).name}"
        except ValueError:
            return f"killed by signal {-end.returncode}"
    return f"exit code {end.returncode}"


def _read(path: Path) -> CellOutcome | None:
    if not path.is_file():
        return None
    try:
        return CellOutcome.from_json(path.read_text())
    except ValueError:
        return None


def judge_ranks(ends: list[RankEnd], logs: list[str], outcomes: list[CellOutcome | None], timeout_s: float) -> CellOutcome:
    """The cell's outcome from how its ranks ended: a crash or a hang names the rank(s); else rank 0's outcome,
    which a rank that did not pass overrides (a pass is every rank's pass)."""
    world = len(ends)
    killed = any(e.killed_after is not None for e in ends)
    bad = next((e.killed_after for e in ends if e.killed_after is not None), None)
    if bad is None:  # a rank that died on its own, after the others had ended: a crash too, outcome or not
        bad = next((r for r, e in enumerate(ends) if e.returncode != 0 and not e.timed_out), None)
    if bad is not None:
        status, reason = classify_death(ends[bad].returncode, False, logs[bad], timeout_s)
        rest = "; the other rank(s) killed" if killed else ""
        return CellOutcome(status=status, reason=f"rank {bad} of {world}: {reason}{rest}"[:2000])
    hung = [r for r, e in enumerate(ends) if e.timed_out]
    if hung:
        status, reason = classify_death(None, True, logs[hung[0]], timeout_s)
        who = f"rank {hung[0]}" if len(hung) == 1 else f"ranks {', '.join(map(str, hung))}"
        return CellOutcome(status=status, reason=f"{who} of {world}: {reason}"[:2000])
    for r, (end, outcome) in enumerate(zip(ends, outcomes)):
        if outcome is None:  # exited 0 (or, the last, nonzero) without writing its outcome
            status, reason = classify_death(end.returncode, False, logs[r], timeout_s)
            return CellOutcome(status=status, reason=f"rank {r} of {world}: {reason}"[:2000])
    first = outcomes[0]
    assert first is not None
    merged = CellOutcome.model_validate(first.model_dump(include=set(CellOutcome.model_fields)))
    merged.metrics.process.rank_statuses = [str(o.status) for o in outcomes if o is not None]
    odd = [(r, o) for r, o in enumerate(outcomes) if o is not None and r and o.status != first.status]
    if odd and first.status in PASSING:
        r, o = next(((r, o) for r, o in odd if o.status not in PASSING), odd[0])
        if o.status not in PASSING:
            merged.status = o.status
            merged.reason = f"rank {r} of {world}: {o.status}: {o.reason}; rank 0: {first.status}"[:2000]
    elif odd:
        merged.reason = (f"{merged.reason}; " + "; ".join(f"rank {r}: {o.status}" for r, o in odd))[:2000]
    return merged


def launch_ranks(cell: Cell, log_path: Path, world: int, gpus: Sequence[int] | None, groups: WorkerGroups,
                 base_env: dict[str, str] | None = None) -> tuple[CellOutcome, str, float]:
    """Run `cell` once as `world` ranks: (its outcome, the merged log, seconds). gpus: the cell's GPUs (CUDA) or
    None (CPU). Raises Cancelled when the runner shut down meanwhile (every rank is down by then)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    results = [rank_path(log_path, r, ".json") for r in range(world)]
    rank_logs = [rank_path(log_path, r, ".log") for r in range(world)]
    for path in results:
        path.unlink(missing_ok=True)
    spec = json.dumps(asdict(cell.spec))
    port = reserve_port()
    procs = []
    t0 = time.perf_counter()
    try:
        try:
            for r in range(world):
                env = rank_env(dict(os.environ) if base_env is None else base_env, r, world, port, gpus)
                with open(rank_logs[r], "w") as log:  # the child holds its own descriptor
                    proc = groups.spawn([sys.executable, *WORKER, str(results[r])], env, log,
                                        cell=cell.key, rank=r, fork=gpus is None)
                procs.append(proc)
                assert proc.stdin is not None  # spawned with stdin=PIPE
                try:
                    proc.stdin.write(spec)
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
        except BaseException:
            groups.discard(procs)
            raise
        ends = groups.wait_all(procs, cell.timeout_s)
    finally:
        release_port(port)
    duration = round(time.perf_counter() - t0, 3)
    texts = [p.read_text(errors="replace") if p.is_file() else "" for p in rank_logs]
    outcomes = [None if e.timed_out or e.killed_after is not None else _read(p) for e, p in zip(ends, results)]
    outcome = judge_ranks(ends, texts, outcomes, cell.timeout_s)
    header = f"PCG-RANKS {world} ranks, port {MASTER_ADDR}:{port}" + (f", GPUs {','.join(map(str, gpus))}" if gpus else "") \
        + ": " + "; ".join(f"rank {r} {_end_words(e)}" for r, e in enumerate(ends))
    text = merged_log(texts, header)
    log_path.write_text(text)
    for p in (*rank_logs, *results):
        p.unlink(missing_ok=True)
    return outcome, text, duration
