"""`pcgh`: one command line for pcg: `run` a matrix, `report` and `diff` runs, one `cell`, the `models`, model
`request`s and the `requests` recorded, and `serve` the dashboard."""

from __future__ import annotations

import argparse
import json
import sys

from pcg_core.capture import capture_backend_names
from pcg_core.config import COMPILERS, DTYPES, ConfigError

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_cell(sub: argparse._SubParsersAction) -> None:
    from pcg_core.attention import attention_backend_names

    p = sub.add_parser("cell", help="run one cell: eager reference vs graph candidate, judged")
    p.add_argument("--model", required=True, help="model-card id, hub id (org/name), local model directory or config.json")
    p.add_argument("--layers", type=_positive_int, help="keep only the first N decoder layers")
    p.add_argument("--tiny", action="store_true", help="shrink to tiny widths (CPU-sized, synthetic weights)")
    p.add_argument("--weights", choices=("auto", "real", "synthetic"), default="auto")
    p.add_argument("--graph", choices=[b for b in capture_backend_names() if b != "disabled"], required=True)
    p.add_argument("--compiler", choices=COMPILERS, default="eager")
    p.add_argument("--attention", choices=attention_backend_names(), default="sdpa")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=list(DTYPES), help="default: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--max-tokens", type=_positive_int, default=4096, help="largest token bucket")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=_positive_int, default=8)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _cmd_cell(args: argparse.Namespace) -> int:
    from harness.cell import CellSpec, run_cell
    from harness.judge import PASSING

    spec = CellSpec(model=args.model, graph=args.graph, attention=args.attention, device=args.device, dtype=args.dtype,
                    layers=args.layers, tiny=args.tiny, weights=args.weights, max_tokens=args.max_tokens,
                    compiler=args.compiler, seed=args.seed, max_new_tokens=args.max_new_tokens)
    result = run_cell(spec)
    if args.json:
        print(json.dumps(result))
    else:
        _print_cell(result)
    return EXIT_PASS if result["status"] in PASSING else EXIT_FAIL


def _print_cell(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    colour = "green" if r["status"].startswith("pass") else "yellow" if r["status"] == "unsupported" else "red"
    console.print(f"[bold {colour}]{r['status']}[/] {r['model']} graph={r['graph']} attention={r['attention']} "
                  f"{r['device']} {r['dtype']} layers={r['layers']}" + (f" — {r['reason']}" if r["reason"] else ""))
    if r["status"] in ("unsupported", "eager_fail"):
        return
    console.print(f"pieces {r['pieces']}, graphs {r['graphs_captured']}, trace {r['trace_s']:.2f}s, "
                  f"capture {r['capture_s']:.2f}s, pool {r['graph_pool_bytes'] / 2**20:.1f} MiB, "
                  f"token match {r['token_match']:.3f}, max logprob diff prompt {r['max_prompt_logprob_diff']} "
                  f"output {r['max_output_logprob_diff']}, eager fallbacks {r['eager_fallbacks']}")
    if r["latency_ms"]:
        t = Table("tokens", "eager ms", "graph ms", "speedup")
        for n, lat in r["latency_ms"].items():
            t.add_row(n, f"{lat['eager']:.2f}", f"{lat['graph']:.2f}", f"{r['speedup'][n]:.2f}x")
        console.print(t)


def _cmd_models(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harness.cards import load_cards
    from pcg_core.model import build_config, unsupported_reason

    t = Table("id", "hub id", "architecture", "features", "runtime")
    for card in load_cards().values():
        try:
            reason = unsupported_reason(build_config(card.config, where=str(card.path)))
        except ConfigError as e:
            reason = str(e)
        t.add_row(card.id, card.hub_id, card.architecture, ", ".join(card.features), "supported" if reason is None else reason)
    Console().print(t)
    return EXIT_PASS


def _filter(text: str) -> dict[str, str]:
    from harness.axes import AXES

    axis, sep, pattern = text.partition("=")
    if not sep or axis not in AXES or not pattern:
        raise argparse.ArgumentTypeError(f"expected AXIS=GLOB with AXIS one of {', '.join(AXES)}, got {text!r}")
    return {axis: pattern}


def _shard(text: str) -> tuple[int, int]:
    m = text.split("/")
    if len(m) != 2 or not all(x.isdigit() for x in m) or not 0 <= int(m[0]) < int(m[1]):
        raise argparse.ArgumentTypeError(f"expected I/N with 0 ≤ I < N, got {text!r}")
    return int(m[0]), int(m[1])


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a matrix (harness/configs/*.yaml) into the results store")
    p.add_argument("matrix", help="matrix YAML file")
    p.add_argument("--db", help="database URL or SQLite file (default: $PCG_DB_URL or sqlite:///pcg.db)")
    p.add_argument("--jobs", type=_positive_int, default=1, help="cells side by side on a CPU (GPU runs use one per GPU)")
    p.add_argument("--shard", type=_shard, help="run shard I of N (by a stable hash of the cell key)")
    p.add_argument("--resume", action="store_true", help="continue the newest unfinished run of this matrix")
    p.add_argument("--filter", type=_filter, action="append", default=[], metavar="AXIS=GLOB")
    p.add_argument("--tier", help="one of the matrix's tiers")
    p.add_argument("--trigger", default="manual", help="recorded with the run (manual, nightly, ci …)")
    p.add_argument("--logs", default="pcg-logs", help="folder for the cells' logs")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their pre-check verdicts, run nothing")
    p.add_argument("--no-report", action="store_true", help="do not print the report at the end")


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="summary, support matrices (CSV) and JSON of a run")
    p.add_argument("run", nargs="?", default="latest", help="run id or 'latest'")
    p.add_argument("--db")
    p.add_argument("--out", help="also write summary.md, report.json and support_*.csv into this folder")


def _add_diff(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changed between two runs")
    p.add_argument("base", help="run id")
    p.add_argument("head", help="run id or 'latest'")
    p.add_argument("--db")
    p.add_argument("--threshold", type=float, default=0.10, help="relative speedup or graph latency change worth reporting")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 if a cell that passed in BASE fails in HEAD")


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from harness.launcher import RunOptions, run_matrix
    from harness.launcher.runner import plan

    opts = RunOptions(jobs=args.jobs, shard=args.shard, resume=args.resume, filters=args.filter, tier=args.tier,
                      trigger=args.trigger, logs_dir=Path(args.logs))
    if args.dry_run:
        _, cells = plan(args.matrix, opts)
        t = Table("key", "pre-check")
        for c in cells:
            t.add_row(c.key, "launch" if c.verdict is None else f"unsupported: {c.verdict}")
        Console(width=200).print(t)
        print(f"{len(cells)} cells, {sum(c.verdict is None for c in cells)} to launch")
        return EXIT_PASS
    from harness.store import Store

    with Store(args.db) as store:
        run_id = run_matrix(args.matrix, store, opts)
        if not args.no_report:
            print(_report_text(store, run_id))
    return EXIT_PASS


def _report_text(store, run_ref) -> str:
    from harness.reports import summary_markdown

    run = store.run(run_ref)
    return summary_markdown(run, store.results(run["id"]))


def _cmd_report(args: argparse.Namespace) -> int:
    from harness.reports import write_report
    from harness.store import Store

    with Store(args.db) as store:
        run = _lookup_run(store, args.run)
        rows = store.results(run["id"])
        print(_report_text(store, run["id"]))
        if args.out:
            for path in write_report(run, rows, args.out):
                print(f"wrote {path}")
    return EXIT_PASS


def _lookup_run(store, ref: str) -> dict:
    try:
        return store.run(int(ref) if ref.isdigit() else ref)
    except KeyError as e:
        raise ConfigError(f"run {ref!r} is not in the store ({e}); `pcgh report` lists the latest run") from e


def _cmd_diff(args: argparse.Namespace) -> int:
    from harness.reports import diff_markdown, diff_runs
    from harness.store import Store

    with Store(args.db) as store:
        base, head = _lookup_run(store, args.base), _lookup_run(store, args.head)
        diff = diff_runs(store.results(base["id"]), store.results(head["id"]), speedup_threshold=args.threshold)
        print(diff_markdown(diff, base, head))
    return EXIT_FAIL if args.fail_on_regression and diff.has_regression else EXIT_PASS


def _add_request(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("request", help="analyze a model from its config.json alone and record the request")
    p.add_argument("model", metavar="MODEL", help="hub id (org/name), local model directory or config.json")
    p.add_argument("--revision", help="hub revision (branch, tag or commit) of a hub id")
    p.add_argument("--quant", nargs="+", action="extend", metavar="Q", help="quantization scheme(s) to ask for (default: the checkpoint's)")
    p.add_argument("--tp", nargs="+", action="extend", type=_positive_int, metavar="N",
                   help="TP size(s) to ask for (default: the smallest that holds the bf16 weights)")
    p.add_argument("--submit", metavar="URL", help="also POST the request to URL/api/requests (token: $PCG_UPLOAD_TOKEN)")
    p.add_argument("--write-card", action="store_true", help="write harness/models/<id>.yaml and its config")
    p.add_argument("--force", action="store_true", help="with --write-card: overwrite an existing card or config")
    p.add_argument("--models-dir", help="the model-card folder --write-card writes into (default: harness/models)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--db", help="database URL or SQLite file (default: $PCG_DB_URL or sqlite:///pcg.db)")


def _add_requests(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("requests", help="list the recorded model requests, newest first")
    p.add_argument("--db", help="database URL or SQLite file (default: $PCG_DB_URL or sqlite:///pcg.db)")
    p.add_argument("--status", help="only requests in this status (requested, in_matrix, passing, failing)")
    p.add_argument("--limit", type=_positive_int)
    p.add_argument("--json", action="store_true", help="print one JSON list")


def _cmd_request(args: argparse.Namespace) -> int:
    from harness.cards import CARDS_DIR
    from harness.request import request_model
    from harness.request.render import print_request

    report = request_model(args.model, revision=args.revision, quants=args.quant, tps=args.tp, db=args.db,
                           write=args.write_card, force=args.force, models_dir=args.models_dir or CARDS_DIR,
                           submit_url=args.submit)
    if args.json:
        print(json.dumps(report))
    else:
        print_request(report)
    return EXIT_PASS


def _cmd_requests(args: argparse.Namespace) -> int:
    from harness.request.render import print_requests
    from harness.store import Store
    from harness.store.models import REQUEST_STATUSES

    if args.status is not None and args.status not in REQUEST_STATUSES:
        raise ConfigError(f"--status {args.status!r} is not a request status; use one of {', '.join(REQUEST_STATUSES)}")
    with Store(args.db) as store:
        rows = store.requests(limit=args.limit, status=args.status)
    if args.json:
        print(json.dumps([{**r, "created_at": r["created_at"].isoformat()} for r in rows]))
    else:
        print_requests(rows)
    return EXIT_PASS


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="the compatibility dashboard (web pages, JSON API, badges) over a results store")
    p.add_argument("--db", help="database URL or SQLite file (default: $PCG_DB_URL or sqlite:///pcg.db)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument("--port", type=_positive_int, default=8000)


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from web.app import create_app

    # The upload token comes from $PCG_UPLOAD_TOKEN only: a flag would show it in `ps`.
    uvicorn.run(create_app(args.db), host=args.host, port=args.port)
    return EXIT_PASS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcgh", description="pcg: piecewise CUDA graphs, judged against eager")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_report(sub)
    _add_diff(sub)
    _add_cell(sub)
    sub.add_parser("models", help="list the model cards and whether the runtime supports them")
    _add_serve(sub)
    _add_request(sub)
    _add_requests(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from pcg_core.plugins import load_plugins

    try:
        load_plugins()
    except ConfigError as e:
        print(f"pcgh: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        commands = {"run": _cmd_run, "report": _cmd_report, "diff": _cmd_diff, "cell": _cmd_cell, "models": _cmd_models,
                    "request": _cmd_request, "requests": _cmd_requests, "serve": _cmd_serve}
        return commands[args.command](args)
    except ConfigError as e:
        print(f"pcgh {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
