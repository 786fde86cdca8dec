"""`pcgh`: one command line for pcg: `run` a matrix, `report` and `diff` runs, one `cell`, the `models`, model
`request`s and the `requests` recorded. Installed packages add commands through the `pcgh.commands` entry-point
group (the dashboard adds `serve`), so the harness never imports them."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from harness.outcome import CellOutcome
from pcg_core.capture import capture_backend_names
from pcg_core.config import COMPILERS, DTYPES
from pcg_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.cell import CellSpec

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
COMMANDS_GROUP = "pcgh.commands"
# The runtime's errors name the config field; on this command line the user typed a flag.
FLAGS = {"backend": "--graph", "attention": "--attention", "compiler": "--compiler", "device": "--device",
         "dtype": "--dtype", "max_tokens": "--max-tokens", "layers": "--layers", "tiny": "--tiny", "weights": "--weights",
         "spec": "--model"}
DB_HELP = "database URL or SQLite file (default: $PCG_DB_URL or sqlite:///pcg.db)"


def error_text(e: ConfigError, command: str) -> str:
    """The message, plus the flag that sets the field it names (for the commands that have that flag)."""
    flag = FLAGS.get(getattr(e, "field", None) or "")
    if not flag or command != "cell":
        return str(e)
    extra = ", which also takes a model-card id: `pcgh models` lists them" if flag == "--model" else ""
    return f"{e} (set by {flag}{extra})"


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help=DB_HELP)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _add_cell(sub: argparse._SubParsersAction) -> None:
    from pcg_core.attention import attention_backend_names
    from pcg_core.capabilities import PARALLEL, QUANTIZATION

    p = sub.add_parser("cell", help="run one cell: eager reference vs graph candidate, judged")
    p.add_argument("--model", required=True, help="model-card id, hub id (org/name), local model directory or config.json")
    p.add_argument("--layers", type=_positive_int, help="keep only the first N decoder layers")
    p.add_argument("--tiny", action="store_true", help="shrink to tiny widths (CPU-sized, synthetic weights)")
    p.add_argument("--weights", choices=("auto", "real", "synthetic"), default="auto")
    p.add_argument("--graph", choices=[b for b in capture_backend_names() if b != "disabled"], required=True)
    p.add_argument("--compiler", choices=COMPILERS, default="eager")
    p.add_argument("--attention", choices=attention_backend_names(), default="sdpa")
    # Not limited to what the runtime has: a matrix cell's repro names its scheme, and the cell says it is unsupported.
    p.add_argument("--quant", default="none", help=f"quantization scheme (the runtime runs: {', '.join(QUANTIZATION)})")
    p.add_argument("--parallel", default="tp1", help=f"parallel mode (the runtime runs: {', '.join(PARALLEL)})")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=list(DTYPES), help="default: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--max-tokens", type=_positive_int, default=4096, help="largest token bucket")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=_positive_int, default=8)
    p.add_argument("--top-k", type=_positive_int, default=5, help="top-k logprobs kept per position for the judge")
    p.add_argument("--logprob-tol", type=_positive_float, help="max |Δlogprob| where tokens agree (default: per dtype)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def spec_from_args(args: argparse.Namespace) -> CellSpec:
    """The cell `pcgh cell` runs: one flag per CellSpec field a matrix sets, so a cell's repro command
    (harness.repro) reruns exactly that cell."""
    from harness.cell import CellSpec

    return CellSpec(model=args.model, graph=args.graph, attention=args.attention, device=args.device, dtype=args.dtype,
                    layers=args.layers, tiny=args.tiny, weights=args.weights, max_tokens=args.max_tokens,
                    compiler=args.compiler, quant=args.quant, parallel=args.parallel, seed=args.seed,
                    max_new_tokens=args.max_new_tokens, top_k=args.top_k, logprob_tol=args.logprob_tol)


def _cmd_cell(args: argparse.Namespace) -> int:
    from harness.cell import run_cell

    spec = spec_from_args(args)
    outcome = run_cell(spec)
    if args.json:  # the outcome, with the spec that produced it
        print(json.dumps({"spec": asdict(spec), **json.loads(outcome.to_json())}))
    else:
        _print_cell(spec, outcome)
    return EXIT_PASS if outcome.passed else EXIT_FAIL


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _print_cell(spec: CellSpec, o: CellOutcome) -> None:
    from rich.console import Console
    from rich.table import Table

    console, m = Console(), o.metrics
    colour = "green" if o.passed else "yellow" if o.status == "unsupported" else "red"
    console.print(f"[bold {colour}]{o.status}[/] {spec.model} quant={spec.quant} attention={spec.attention} "
                  f"parallel={spec.parallel} graph={spec.graph} compiler={spec.compiler} "
                  f"{m.device} {m.dtype} layers={m.layers}" + (f" — {o.reason}" if o.reason else ""))
    if m.pieces is None:
        return  # ended before capture: nothing measured
    pool = None if m.graph_pool_bytes is None else m.graph_pool_bytes / 2**20
    console.print(f"pieces {m.pieces}, graphs {m.graphs_captured}, trace {_num(m.trace_s)}s, "
                  f"capture {_num(m.capture_s)}s, pool {_num(pool, '.1f')} MiB, token match {_num(m.token_match, '.3f')}, "
                  f"max logprob diff prompt {m.max_prompt_logprob_diff} output {m.max_output_logprob_diff}, "
                  f"eager fallbacks {m.eager_fallbacks}")
    if m.latency_ms:
        t = Table("tokens", "eager ms", "graph ms", "speedup")
        for n, lat in m.latency_ms.items():
            t.add_row(str(n), _num(lat.eager), _num(lat.graph), f"{_num(m.speedup.get(n))}x")
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
    from harness.outcome import AXES

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
    _add_db(p)
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
    _add_db(p)
    p.add_argument("--out", help="also write summary.md, report.json and support_*.csv into this folder")


def _add_diff(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changed between two runs")
    p.add_argument("base", help="run id")
    p.add_argument("head", help="run id or 'latest'")
    _add_db(p)
    p.add_argument("--threshold", type=float, default=0.10, help="relative speedup or graph latency change worth reporting")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 if a cell that passed in BASE fails in HEAD")


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from harness.launcher import RunOptions, plan, run_matrix

    opts = RunOptions(jobs=args.jobs, shard=args.shard, resume=args.resume, filters=args.filter, tier=args.tier,
                      trigger=args.trigger, logs_dir=Path(args.logs))
    if args.dry_run:
        cells = plan(args.matrix, opts).cells
        t = Table("key", "pre-check")
        for c in cells:
            t.add_row(c.key, "launch" if c.unsupported is None else f"unsupported: {c.unsupported}")
        Console(width=200).print(t)
        print(f"{len(cells)} cells, {sum(c.unsupported is None for c in cells)} to launch")
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
    _add_db(p)


def _add_requests(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("requests", help="list the recorded model requests, newest first")
    _add_db(p)
    p.add_argument("--status", help="only requests in this status (requested, in_matrix, passing, failing)")
    p.add_argument("--limit", type=_positive_int)
    p.add_argument("--json", action="store_true", help="print one JSON list")


def _cmd_request(args: argparse.Namespace) -> int:
    from harness.cards import CARDS_DIR
    from harness.request.command import request_model
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


def _plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Commands other installed packages contribute: each entry point is `add_command(subparsers)`, which adds a
    subparser whose `handler(args) -> int` runs it."""
    for ep in entry_points(group=COMMANDS_GROUP):
        try:
            add_command = ep.load()
        except ImportError as e:  # its extra is not installed: the command says so instead of pcgh failing
            p = sub.add_parser(ep.name, help=f"(unavailable: {e.name or e} is not installed)")
            p.set_defaults(handler=_unavailable(ep.name, e), takes_any_arguments=True)
            continue
        add_command(sub)


def _unavailable(name: str, e: ImportError) -> Callable[[argparse.Namespace], int]:
    def handler(_: argparse.Namespace) -> int:
        raise ConfigError(f"`pcgh {name}` needs {e.name or 'a package'} ({e}); install the extra that brings it "
                          f"(the dashboard's: pip install \"pcg[web]\")")

    return handler


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcgh", description="pcg: piecewise CUDA graphs, judged against eager")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_report(sub)
    _add_diff(sub)
    _add_cell(sub)
    sub.add_parser("models", help="list the model cards and whether the runtime supports them")
    _add_request(sub)
    _add_requests(sub)
    _plugin_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from pcg_core.plugins import load_plugins

    try:
        load_plugins()
    except ConfigError as e:
        print(f"pcgh: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    commands = {"run": _cmd_run, "report": _cmd_report, "diff": _cmd_diff, "cell": _cmd_cell, "models": _cmd_models,
                "request": _cmd_request, "requests": _cmd_requests}
    try:
        return commands[args.command](args) if args.command in commands else args.handler(args)
    except ConfigError as e:
        print(f"pcgh {args.command}: error: {error_text(e, args.command)}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
