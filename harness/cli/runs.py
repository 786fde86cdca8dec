"""`pcgh run`, `report` and `diff`: a matrix into the store, and what the store says about its runs.

Exit codes a CI can gate on: 0 when every launched cell passed, 1 when one failed (a counted status that is not
a pass: fail_*, timeout, oom, eager_nondeterministic; eager_fail, unsupported and skipped do not fail a run) or,
for `diff --fail-on-regression`, when a cell that passed in BASE fails in HEAD; 2 for bad input. `report` and
`diff` only read: they never create a database.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.args import add_db, add_executor, axis_filter, matrix_file, positive_int, shard_arg, threshold, writable_dir
from harness.outcome import AXES, CellRecord
from pcg_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.matrix import Matrix
    from harness.store import Store
    from harness.store.rows import RunRow

EXIT_PASS, EXIT_FAIL = 0, 1
SHOWN_FAILURES = 10  # failing cells listed after a run; `pcgh report` has them all
SHOWN_REASONS = 8  # groups of cells not run (status and reason) listed after a run
RUNS_SHOWN = 20  # runs `pcgh runs` lists unless --limit says otherwise


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a matrix (harness/configs/*.yaml) into the results store",
                       description="Run a matrix into the results store. Exit status: 0 when every launched cell "
                                   "passed, 1 when one failed (fail_*, timeout, oom, eager_nondeterministic; not "
                                   "eager_fail, unsupported or skipped), 2 for bad input.")
    p.add_argument("matrix", help="matrix YAML file")
    add_db(p)
    p.add_argument("--jobs", type=positive_int, default=1, help="cells side by side on a CPU (GPU runs use one per GPU)")
    p.add_argument("--shard", type=shard_arg, help="run shard I of N (by a stable hash of the cell key)")
    add_executor(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the newest unfinished run of this matrix (the same file however its path is "
                        "written; a finished run is left as it is); give the same --db and --logs")
    p.add_argument("--filter", type=axis_filter, action="append", default=[], metavar="AXIS=GLOB",
                   help=f"only cells whose AXIS matches GLOB (AXIS one of {', '.join(AXES)}); repeat to narrow further")
    p.add_argument("--tier", help="one of the matrix's tiers")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="run each cell in N fresh processes; any non-pass among them is the cell's status (no retry)")
    p.add_argument("--trigger", default="manual", help="recorded with the run (manual, nightly, ci …)")
    p.add_argument("--logs", default="pcg-logs", help="folder for the cells' logs")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their pre-check verdicts, run nothing")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even when cells fail (exploratory runs)")
    p.add_argument("--no-report", action="store_true", help="do not print the summary at the end")
    p.set_defaults(handler=run)

    p = sub.add_parser("report", help="summary, support matrices (CSV) and JSON of a run")
    p.add_argument("run", nargs="?", default="latest", help="run id or 'latest'")
    add_db(p)
    p.add_argument("--out", help="also write summary.md, report.json and support_*.csv into this folder")
    p.set_defaults(handler=report)

    p = sub.add_parser("runs", help="list the runs in the store, newest first: ids for report and diff",
                       description="List the runs in the store, newest first: id, matrix name, status, trigger, start "
                                   "time and cells (passing, failing, not counted). Reads only: never creates a "
                                   "database.")
    add_db(p)
    p.add_argument("--name", help="only runs of this matrix name (e.g. smoke, nightly)")
    p.add_argument("--limit", type=positive_int, default=RUNS_SHOWN, help="at most this many (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON list (every run's counts by status too)")
    p.set_defaults(handler=list_runs)

    p = sub.add_parser("diff", help="what changed between two runs")
    p.add_argument("base", help="run id")
    p.add_argument("head", help="run id or 'latest'")
    add_db(p)
    p.add_argument("--threshold", type=threshold, default=0.10,
                   help="relative speedup or graph latency change worth reporting, 0 to 100 (default 0.1: 10%%)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 if a cell that passed in BASE fails in HEAD")
    p.set_defaults(handler=diff)


def preflight(path: str, filters: list[dict[str, str]], tier: str | None, selection: bool = True) -> Matrix:
    """The matrix read (bounded), its names checked and (with `selection`) its filters and tier selecting cells,
    before the launcher's imports (torch: seconds): bad input is refused at once, before anything is written.
    The plan reads it again, and checks each cell against the runtime."""
    from harness.matrix import load_matrix, select

    matrix = load_matrix(matrix_file(path))
    if selection:
        select(matrix, filters, tier, path)
    return matrix


def run(args: argparse.Namespace) -> int:
    preflight(args.matrix, args.filter, args.tier)
    from rich.console import Console
    from rich.table import Table

    from harness.launcher import RunOptions, plan, run_matrix

    opts = RunOptions(jobs=args.jobs, shard=args.shard, resume=args.resume, filters=args.filter, tier=args.tier,
                      executor=args.executor, address=args.address,
                      trigger=args.trigger, logs_dir=Path(args.logs), repeats=args.repeats)
    planned = plan(args.matrix, opts)  # a bad matrix is refused before anything is written
    cells = planned.cells
    if args.dry_run:
        t = Table("key", "ranks", "pre-check")  # ranks: processes; on CUDA, the GPUs the cell holds
        for c in cells:
            t.add_row(c.key, str(c.ranks), "launch" if c.unsupported is None else f"unsupported: {c.unsupported}")
        Console(width=200).print(t)
        print(f"{len(cells)} cells, {sum(c.unsupported is None for c in cells)} to launch")
        return EXIT_PASS
    writable_dir(opts.logs_dir, "--logs")
    from harness.store import Store

    with Store(args.db) as store:
        run_id = run_matrix(args.matrix, store, opts, planned=planned)
        run, records = store.run(run_id), store.results(run_id)
    from harness.reports.stats import is_failing

    failed = [r for r in records if is_failing(r.status)]
    if not args.no_report:
        print(end_summary(run, records, failed, args.db))
    return EXIT_FAIL if failed and not args.allow_failures else EXIT_PASS


def end_summary(run: RunRow, records: list[CellRecord], failed: list[CellRecord], db: str | None) -> str:
    """A few lines: the counts, the pass rate, the speedup (not on CPU, where nothing is captured), the first
    failing cells, the cells not run grouped by reason, and where the full report and the dashboard are."""
    import shlex
    from collections import Counter

    from harness.outcome import NOT_COUNTED
    from harness.reports.frame import result_rows
    from harness.reports.markdown import one_line
    from harness.reports.run_info import wall_time
    from harness.reports.stats import fmt_rate, fmt_speedup, is_counted, is_passing, ordered_statuses, totals

    counts: Counter[str] = Counter(r.status for r in records)
    passing = sum(is_passing(r.status) for r in records)
    counted = sum(is_counted(r.status) for r in records)
    took = ""
    if (wt := wall_time(run)) is not None:
        secs = int(wt.total_seconds())
        took = f" in {secs // 60} min {secs % 60:02d} s"
    lines = [f"run {run.id} ({run.name}, {run.status}{took}): {len(records)} cells, "
             + ", ".join(f"{counts[s]} {s}" for s in ordered_statuses(counts))
             + f"; pass rate {fmt_rate(passing / counted if counted else None)} ({passing}/{counted} counted)"]
    t = totals(result_rows(records))
    if not t.speedup_measured:
        lines.append("speedup: not measured on CPU (no CUDA graphs are captured there)")
    elif t.speedup_cells:
        lines.append(f"geomean speedup {fmt_speedup(t.geomean_speedup)} over {t.speedup_cells} passing cell(s)")
    for r in failed[:SHOWN_FAILURES]:
        lines.append(f"  {r.status}: {r.key}" + (f" — {r.reason.splitlines()[0][:160]}" if r.reason else ""))
    if len(failed) > SHOWN_FAILURES:
        lines.append(f"  … and {len(failed) - SHOWN_FAILURES} more failing")
    lines += _not_run_lines([r for r in records if r.status in NOT_COUNTED], one_line)
    db_flag = f" --db {shlex.quote(db)}" if db else ""
    lines.append(f"full report: pcgh report {run.id}{db_flag}")
    lines.append(f"dashboard: pcgh serve{db_flag}")
    return "\n".join(lines)


def _not_run_lines(records: list[CellRecord], one_line: Any) -> list[str]:
    """Cells not held against the graph path (unsupported, eager_fail, skipped), one line per status and reason,
    most cells first: what the runtime cannot run yet, and why."""
    from collections import Counter

    groups = Counter((str(r.status), one_line(r.reason, limit=160) or "(no reason given)") for r in records)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"  {n} {status}: {reason}" for (status, reason), n in ordered[:SHOWN_REASONS]]
    if len(ordered) > SHOWN_REASONS:
        lines.append(f"  … and {len(ordered) - SHOWN_REASONS} more reasons (`pcgh report` lists them)")
    return lines


def _read_store(db: str | None) -> Store:
    from harness.store import Store

    return Store(db, read_only=True)


def _lookup_run(store: Store, ref: str) -> RunRow:
    try:
        return store.run(int(ref) if ref.isdigit() else ref)
    except KeyError as e:
        raise ConfigError(f"run {ref!r} is not in the store ({e}); `pcgh runs` lists the runs there") from e


def report(args: argparse.Namespace) -> int:
    from harness.reports import summary_markdown, write_report

    out = Path(args.out) if args.out else None
    if out is not None:
        writable_dir(out, "--out")
    with _read_store(args.db) as store:
        run = _lookup_run(store, args.run)
        rows = store.results(run.id)
    print(summary_markdown(run, rows))
    if out is not None:
        try:
            paths = write_report(run, rows, out)
        except OSError as e:
            raise ConfigError(f"--out {out}: cannot write the report there ({e.strerror or e}: {e.filename})") from None
        for path in paths:
            print(f"wrote {path}")
    return EXIT_PASS


def list_runs(args: argparse.Namespace) -> int:
    """The runs through the Store's reads (runs, and the precounted cells by status): ids to give report and diff."""
    import json

    from harness.outcome import NOT_COUNTED, PASSING
    from harness.store.db import mask

    with _read_store(args.db) as store:
        runs = store.runs(name=args.name)
        shown = runs[: args.limit]
        counts = store.views.status_counts([r.id for r in shown])
        where = mask(store.url)
    rows = []
    for r in shown:
        c = counts[r.id]
        passing = sum(n for s, n in c.items() if s in PASSING)
        not_counted = sum(n for s, n in c.items() if s in NOT_COUNTED)
        rows.append({"id": r.id, "name": r.name, "matrix": r.matrix, "status": r.status,
                     "trigger": r.trigger, "started_at": r.started_at, "finished_at": r.finished_at,
                     "cells": sum(c.values()), "passing": passing, "failing": sum(c.values()) - passing - not_counted,
                     "not_counted": not_counted, "counts": dict(c)})
    if args.json:
        print(json.dumps(rows, default=lambda v: v.isoformat()))
        return EXIT_PASS
    if not rows:
        of = f" of matrix {args.name!r}" if args.name else ""
        print(f"no runs{of} in {where} yet; `pcgh run harness/configs/smoke.yaml` records one")
        return EXIT_PASS
    print(_runs_table(rows))
    listed = f"{len(rows)} newest of {len(runs)} runs (--limit {len(runs)} lists all)" if len(runs) > len(rows) \
        else f"{len(runs)} run(s)"
    print(f"{listed}. `pcgh report ID` shows one, `pcgh diff BASE HEAD` compares two.")
    return EXIT_PASS


def _runs_table(rows: list[dict[str, Any]]) -> str:
    header = ("id", "name", "status", "trigger", "started (UTC)", "cells", "pass", "fail", "not counted")
    lines = [(str(r["id"]), r["name"], r["status"], r["trigger"],
              r["started_at"].strftime("%Y-%m-%d %H:%M") if r["started_at"] else "?", str(r["cells"]),
              str(r["passing"]), str(r["failing"]), str(r["not_counted"])) for r in rows]
    widths = [max(len(x[i]) for x in (header, *lines)) for i in range(len(header))]
    right = {0, 5, 6, 7, 8}  # numbers
    def line(cols: tuple[str, ...]) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(cols, widths))).rstrip()

    return "\n".join(line(x) for x in (header, *lines))


def diff(args: argparse.Namespace) -> int:
    from harness.reports import diff_markdown, diff_runs

    with _read_store(args.db) as store:
        base, head = _lookup_run(store, args.base), _lookup_run(store, args.head)
        d = diff_runs(store.results(base.id), store.results(head.id), speedup_threshold=args.threshold)
    print(diff_markdown(d, base, head))
    return EXIT_FAIL if args.fail_on_regression and d.has_regression else EXIT_PASS
