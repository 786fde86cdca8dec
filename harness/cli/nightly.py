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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.cli.args import add_db, axis_filter, positive_int, shard_arg, threshold, writable_dir
from harness.cli.runs import EXIT_FAIL, EXIT_PASS, end_summary, preflight
from pcg_core.errors import ConfigError

TRIGGER = "nightly"
UPLOAD_ENV = "PCG_UPLOAD_URL"


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nightly", help="run a matrix as the nightly and gate on regressions (not on noise)",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("matrix", help="matrix YAML file")
    add_db(p)
    p.add_argument("--jobs", type=positive_int, default=1, help="cells side by side on a CPU (GPU runs use one per GPU)")
    p.add_argument("--shard", type=shard_arg, help="run shard I of N (by a stable hash of the cell key)")
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
    # Bad input before torch loads. Requested models may join the model axis (below), so with requests a model
    # filter, and whether any cell is selected, are checked against the axis they join, in the plan made then.
    from harness.matrix import check_selection, select

    matrix = preflight(args.matrix, args.filter, args.tier, selection=False)
    variant = matrix.nightly.requests if args.requests is None else (None if args.requests == "none" else args.requests)
    if variant is None:
        select(matrix, args.filter, args.tier, args.matrix)
    else:
        check_selection(matrix, args.filter, args.tier, args.matrix, skip=("model",))
    from harness.launcher import RunOptions, plan, run_matrix
    from harness.reports import diff_markdown, diff_runs, write_report
    from harness.reports.policy import Policy, judge_night, verdict_markdown
    from harness.request import lifecycle
    from harness.request.submit import RUNS_ENDPOINT, endpoint, submit, token
    from harness.store import Store

    if args.upload:  # before any work: an upload that could never succeed
        endpoint(args.upload, RUNS_ENDPOINT, "--upload")
        token("--upload")
    opts = RunOptions(jobs=args.jobs, shard=args.shard, resume=args.resume, filters=args.filter, tier=args.tier,
                      trigger=TRIGGER, logs_dir=Path(args.logs))
    m = matrix.nightly
    policy = Policy(keep=args.keep or m.keep, window=args.window or m.window,
                    latency_threshold=m.latency_threshold if args.latency_threshold is None else args.latency_threshold)
    planned = plan(args.matrix, opts) if variant is None else None
    writable_dir(opts.logs_dir, "--logs")
    out = Path(args.out) if args.out else None
    if out is not None:
        writable_dir(out, "--out")
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
        earlier = [r for r in store.runs(name=run["name"], trigger=TRIGGER) if r["id"] != run_id and r["status"] == "finished"]
        earlier = earlier[: max(policy.keep, 2 * policy.window - 1)]
        history = [store.results(r["id"]) for r in earlier]
    from harness.reports.stats import is_failing

    verdict = judge_night(records, history, policy)
    print(end_summary(run, records, [r for r in records if is_failing(r.status)], args.db))
    text = verdict_markdown(verdict, {r.key: r for r in records}) + _requests_markdown(joined, moved)
    print(text)
    requests = {"moved": {str(k): {"status": s, "reason": why} for k, (s, why) in moved.items()},
                "left_out": {str(k): why for k, why in joined.left_out.items()}}
    if out is not None:
        write_report(run, records, out)
        (out / "nightly.md").write_text(text, encoding="utf-8")
        (out / "nightly.json").write_text(json.dumps({"run_id": run_id, "failed": verdict.failed, **asdict(verdict),
                                                      "requests": requests}, indent=2, default=str) + "\n", encoding="utf-8")
        if earlier:
            d = diff_runs(history[0], records)
            (out / "diff.md").write_text(diff_markdown(d, earlier[0], run), encoding="utf-8")
    if args.upload:
        try:
            sent = submit(args.upload, _run_body(run, records), path=RUNS_ENDPOINT, flag="--upload")
        except ConfigError as e:
            raise ConfigError(f"{e} (the night is recorded in the local store as run {run_id}"
                              + (f" and written to {out}" if out else "") + ")") from e
        print(f"uploaded run {run_id} to {sent['url']}: HTTP {sent['status']}")
    return EXIT_FAIL if verdict.failed else EXIT_PASS


def _run_body(run: dict[str, Any], records: list) -> dict[str, Any]:
    """The dashboard's RunIn: the run's own times, provenance and final cell records."""
    from harness.store.models import PROVENANCE

    return {"name": run["name"], "matrix": run["matrix"], "trigger": run["trigger"], "status": run["status"],
            "provenance": {k: run.get(k) for k in PROVENANCE}, "started_at": run["started_at"],
            "finished_at": run["finished_at"], "results": [r.model_dump(mode="json") for r in records]}


def _requests_markdown(joined: Any, moved: dict[int, tuple[str, str]]) -> str:
    if not joined.requests and not joined.left_out:
        return ""
    lines = ["", "## Model requests", ""]
    for i, models in joined.requests.items():
        status, why = moved.get(i, ("in_matrix", "no cell of it in this run (filter, tier or shard)"))
        lines.append(f"- request #{i} ({', '.join(models)}): **{status}**: {why}")
    lines += [f"- request #{i}: left out: {why}" for i, why in joined.left_out.items()]
    return "\n".join(lines) + "\n"
