"""`pcgh`: one command line for pcg. Subcommands: `cell` (one matrix point), `models` (the model cards)."""

from __future__ import annotations

import argparse
import json
import sys

from pcg_core.config import CAPTURE_BACKENDS, COMPILERS, DTYPES, ConfigError

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
    p.add_argument("--graph", choices=[b for b in CAPTURE_BACKENDS if b != "disabled"], required=True)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcgh", description="pcg: piecewise CUDA graphs, judged against eager")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_cell(sub)
    sub.add_parser("models", help="list the model cards and whether the runtime supports them")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return {"cell": _cmd_cell, "models": _cmd_models}[args.command](args)
    except ConfigError as e:
        print(f"pcgh {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
