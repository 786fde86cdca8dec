"""`pcgh nightly`: run a matrix as tonight's nightly, compare it with the nightlies before it, gate by the policy.

One command for a CI job: the run (resumable, sharded, cells retried once: a pass on the retry is `pass_flaky`),
with every model request that has a card joined to the model axis, then the verdict of harness/reports/policy.py
against the earlier nightlies of the same matrix in the same store (regressions and lasting graph-latency
slowdowns fail; flaky cells, known failures and eager-speedup changes are reported), each joined request moved to
passing, failing or unsupported by its cells, the diff against the last nightly, the reports, and the upload of
the run to a dashboard. Exit status: 0 the night passes, 1 it fails, 2 bad input or a failed upload. Thresholds
and the requests' variant: the matrix file's `nightly:` block, overridden by the flags.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.args import add_db, add_executor, axis_filter, positive_int, shard_arg, threshold, writable_dir
from harness.cli.runs import EXIT_FAIL, EXIT_PASS, end_summary, preflight
from pcg_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.launcher import Plan, RunOptions
    from harness.matrix import Matrix
    from harness.outcome import CellRecord
    from harness.reports.policy import NightlyVerdict, Policy
    from harness.request.lifecycle import Joined
    from harness.store.rows import RunRow

TRIGGER = "nightly"
UPLOAD_ENV = "PCG_UPLOAD_URL"


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nightly", help="run a matrix as the nightly and gate on regressions (not on noise)",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("matrix", help="matrix YAML file")
    add_db(p)
    p.add_argument("--jobs", type=positive_int, default=1, help="cells side by side on a CPU (GPU runs use one per GPU)")
    p.add_argument("--shard", type=shard_arg, help="run shard I of N (by a stable hash of the cell key)")
    add_executor(p)
    p.add_argument("--resume", action="store_true", help="continue tonight's unfinished run of this matrix")
    p.add_argument("--filter", type=axis_filter, action="append", default=[], metavar="AXIS=GLOB",
                   help="only cells whose AXIS matches GLOB; repeat to narrow further")
    p.add_argument("--tier", help="one of the matrix's tiers")
    p.add_argument("--logs", default="pcg-logs", help="folder for the cells' logs")
    p.add_argument("--out", help="write summary.md, report.json, support_*.csv, nightly.md, nightly.json and diff.md here")
    p.add_argument("--keep", type=positive_int, help="a regression passed in each of the last KEEP nightlies it ran in")
    p.add_argument("--window", type=positive_int, help="nightlies per median of the graph-latency trend")
    p.add_argument("--latency-threshold", type=threshold,
                   help="relative growth of the median graph latency that fails the night (0.15: 15%%)")
    p.add_argument("--requests", metavar="VARIANT",
                   help="join every model request with a card at this variant (tiny, trim:N, full); default: the "
                        "matrix's nightly.requests; 'none': no requests")
    p.add_argument("--upload", metavar="URL", default=os.environ.get(UPLOAD_ENV) or None,
                   help=f"POST the run to this dashboard (token in $PCG_UPLOAD_TOKEN; default ${UPLOAD_ENV})")
    p.set_defaults(handler=nightly)


def nightly(args: argparse.Namespace) -> int:
    """The night: the run, its verdict against the nightlies before it, the reports and the upload; the exit
    status says whether it passed."""
    matrix, variant = _read_matrix(args)
    from harness.launcher import RunOptions, plan
    from harness.reports.policy import Policy, judge_night, verdict_markdown
    from harness.request.submit import RUNS_ENDPOINT, endpoint, token

    if args.upload:  # before any work: an upload that could never succeed
        endpoint(args.upload, RUNS_ENDPOINT, "--upload")
        token("--upload")
    opts = RunOptions(jobs=args.jobs, shard=args.shard, resume=args.resume, filters=args.filter, tier=args.tier,
                      executor=args.executor, address=args.address,
                      trigger=TRIGGER, logs_dir=Path(args.logs))
    m = matrix.nightly
    policy = Policy(keep=args.keep or m.keep, window=args.window or m.window,
                    latency_threshold=m.latency_threshold if args.latency_threshold is None else args.latency_threshold)
    planned = plan(args.matrix, opts) if variant is None else None
    writable_dir(opts.logs_dir, "--logs")
    out = Path(args.out) if args.out else None
    if out is not None:
        writable_dir(out, "--out")
    night = _run_night(args, matrix, variant, opts, planned, policy)
    from harness.reports.stats import is_failing

    verdict = judge_night(night.records, night.history, policy)
    print(end_summary(night.run, night.records, [r for r in night.records if is_failing(r.status)], args.db))
    text = verdict_markdown(verdict, {r.key: r for r in night.records}) + _requests_markdown(night.joined, night.moved)
    print(text)
    if out is not None:
        _write_outputs(out, night, verdict, text)
    if args.upload:
        _upload(args.upload, night, out)
    return EXIT_FAIL if verdict.failed else EXIT_PASS


def _read_matrix(args: argparse.Namespace) -> tuple[Matrix, str | None]:
    """(the matrix, the variant requests join at; None: no requests). Bad input before torch loads. Requested
    models may join the model axis, so with requests a model filter, and whether any cell is selected, are
    checked against the axis they join, in the plan made then."""
    from harness.matrix import check_selection, select

    matrix = preflight(args.matrix, args.filter, args.tier, selection=False)
    variant = matrix.nightly.requests if args.requests is None else (None if args.requests == "none" else args.requests)
    if variant is None:
        select(matrix, args.filter, args.tier, args.matrix)
    else:
        check_selection(matrix, args.filter, args.tier, args.matrix, skip=("model",))
    return matrix, variant


@dataclass
class _Night:
    """Tonight's run as the store holds it when the run ends: its records, the requests it joined and moved, and
    the earlier nightlies (newest first) the policy judges it against."""

    run_id: int
    run: RunRow
    records: list[CellRecord]
    joined: Joined
    moved: dict[int, tuple[str, str]]
    earlier: list[RunRow]
    history: list[list[CellRecord]]


def _run_night(args: argparse.Namespace, matrix: Matrix, variant: str | None, opts: RunOptions, planned: Plan | None,
               policy: Policy) -> _Night:
    """The run, with the requests' models joined to the model axis (planned only now, when they are known), and
    what the verdict reads, read before the store closes."""
    from harness.launcher import plan, run_matrix
    from harness.request import lifecycle
    from harness.store import Store

    with Store(args.db) as store:
        present = list(matrix.axes.model)
        joined = lifecycle.join_requests(store, variant, present) if variant else lifecycle.Joined()
        if planned is None:
            opts.extra_models = tuple(model for model in joined.models if model not in present)
            planned = plan(args.matrix, opts)
        lifecycle.mark_in_matrix(store, joined)
        run_id = run_matrix(args.matrix, store, opts, planned=planned)
        run, records = store.run(run_id), store.results(run_id)
        moved = lifecycle.record_outcomes(store, run_id, joined, records)
        # the earlier nightlies of this matrix name, wherever its file was checked out (CI runners, the GPU machine)
        earlier = [r for r in store.runs(name=run.name, trigger=TRIGGER) if r.id != run_id and r.status == "finished"]
        earlier = earlier[: max(policy.keep, 2 * policy.window - 1)]
        history = [store.results(r.id) for r in earlier]
    return _Night(run_id, run, records, joined, moved, earlier, history)


def _write_outputs(out: Path, night: _Night, verdict: NightlyVerdict, text: str) -> None:
    """--out: the reports, the verdict as text and JSON (with what became of the requests), the diff against the
    last nightly when there is one."""
    from harness.reports import diff_markdown, diff_runs, write_report

    requests = {"moved": {str(k): {"status": s, "reason": why} for k, (s, why) in night.moved.items()},
                "left_out": {str(k): why for k, why in night.joined.left_out.items()}}
    write_report(night.run, night.records, out)
    (out / "nightly.md").write_text(text, encoding="utf-8")
    (out / "nightly.json").write_text(json.dumps({"run_id": night.run_id, "failed": verdict.failed, **asdict(verdict),
                                                  "requests": requests}, indent=2, default=str) + "\n", encoding="utf-8")
    if night.earlier:
        d = diff_runs(night.history[0], night.records)
        (out / "diff.md").write_text(diff_markdown(d, night.earlier[0], night.run), encoding="utf-8")


def _upload(url: str, night: _Night, out: Path | None) -> None:
    """The run to the dashboard; a failed upload says the night is recorded all the same, and where."""
    from harness.request.submit import RUNS_ENDPOINT, submit

    try:
        sent = submit(url, _run_body(night.run, night.records), path=RUNS_ENDPOINT, flag="--upload")
    except ConfigError as e:
        raise ConfigError(f"{e} (the night is recorded in the local store as run {night.run_id}"
                          + (f" and written to {out}" if out else "") + ")") from e
    print(f"uploaded run {night.run_id} to {sent['url']}: HTTP {sent['status']}")


def _run_body(run: RunRow, records: list) -> dict[str, Any]:
    """The dashboard's RunIn: the run's own times, provenance and final cell records."""
    return {"name": run.name, "matrix": run.matrix, "trigger": run.trigger, "status": run.status,
            "provenance": run.provenance, "started_at": run.started_at,
            "finished_at": run.finished_at, "results": [r.model_dump(mode="json") for r in records]}


def _requests_markdown(joined: Any, moved: dict[int, tuple[str, str]]) -> str:
    if not joined.requests and not joined.left_out:
        return ""
    lines = ["", "## Model requests", ""]
    for i, models in joined.requests.items():
        status, why = moved.get(i, ("in_matrix", "no cell of it in this run (filter, tier or shard)"))
        lines.append(f"- request #{i} ({', '.join(models)}): **{status}**: {why}")
    lines += [f"- request #{i}: left out: {why}" for i, why in joined.left_out.items()]
    return "\n".join(lines) + "\n"
