"""`pcgh cell`: one cell, eager reference against graph candidate, judged; its flags are CellSpec's fields.

The parser takes backend names as text and the runtime checks them (a ConfigError naming the field, which
harness.cli maps back to the flag), so building the parser, and `pcgh --help`, never imports torch."""

from __future__ import annotations

import argparse
import difflib
import faulthandler
import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING

from harness.cell.spec import CPU_MAX_TOKENS, GPU_MAX_TOKENS
from harness.cli.args import DefaultsShown, bounded_int, positive_float, positive_int, seed_int, share_float
from harness.outcome import ENGINES
from pcg_core.known import COMPILERS, DTYPE_NAMES, KNOWN_QUANTIZATION, KV_CACHE_DTYPES, MAX_TOKENS, world_size
from pcg_core.quant.schemes import registry as quant_registry
from pcg_core.registry import CAPTURE_BACKENDS

if TYPE_CHECKING:
    from harness.cell import CellSpec
    from harness.outcome import CellOutcome

EXIT_PASS, EXIT_FAIL = 0, 1


DESCRIPTION = ("Run one cell: an eager reference and a graph candidate built on the same weights, run over a prompt "
               "suite derived from the bucket ladder, the candidate judged against eager (greedy tokens, logprobs, KL, "
               "the graph at its own padding) and both timed. Every setting a matrix gives a cell has a flag, so the "
               "dashboard's repro command reruns exactly that cell. Exit status: 0 pass, 1 any other status, 2 bad "
               "input.")
EPILOG = """examples:
  pcgh cell --model qwen3-0.6b --tiny --graph breakable --device cpu --json
  pcgh cell --model Qwen/Qwen3-0.6B --graph piecewise --device cuda          # real weights from the hub
  pcgh cell --model path/to/config.json --layers 4 --graph full --device cuda # real widths, synthetic weights"""


def add(sub: argparse._SubParsersAction) -> None:
    graphs = [b for b in CAPTURE_BACKENDS.built_in if b != "disabled"]
    p = sub.add_parser("cell", help="run one cell: eager reference vs graph candidate, judged", description=DESCRIPTION,
                       epilog=EPILOG, formatter_class=DefaultsShown)
    p.add_argument("--model", required=True, help="model-card id (`pcgh models`), hub id (org/name), local model "
                                                  "directory or config.json")
    p.add_argument("--layers", type=positive_int, help="keep only the first N decoder layers (at most the model's)")
    p.add_argument("--tiny", action="store_true", help="shrink to tiny widths (CPU-sized, synthetic weights)")
    p.add_argument("--weights", choices=("auto", "real", "synthetic"), default="auto",
                   help="real: the checkpoint's (a hub id, or a directory with safetensors); synthetic: random, "
                        "seeded; auto: real where the model has them, unless --tiny")
    p.add_argument("--flat-weights", action="store_true",
                   help="synthetic weights as initialized (flat next-token distributions), not peaked for the judge")
    p.add_argument("--graph", required=True, metavar="BACKEND",
                   help=f"capture backend of the candidate: {', '.join(graphs)} (or one a plugin registers)")
    p.add_argument("--compiler", choices=COMPILERS, default="eager",
                   help="how the graph candidate's pieces are built: eager (as traced) or inductor (torch.compile's)")
    p.add_argument("--attention", default="sdpa", metavar="BACKEND",
                   help="attention backend (an unknown name lists the registered ones)")
    # Not limited to what the runtime has: a matrix cell's repro names its scheme, and the cell says it is unsupported.
    p.add_argument("--quant", type=_quant, default="none",
                   help="quantization scheme (a known one the runtime lacks ends the cell unsupported)")
    p.add_argument("--parallel", type=_parallel, default="tp1",
                   help="parallel mode: tp2, tp2-ep8 … (one the runtime lacks ends the cell unsupported); a mode of "
                        "several ranks runs one worker process per rank, as `pcgh run` does")
    p.add_argument("--kv-cache", "--kv_cache", dest="kv_cache", choices=KV_CACHE_DTYPES, default="auto",
                   help="what the KV cache stores: auto (the model's dtype) or fp8_e4m3 (FP8 with per-layer K/V scales: "
                        "the checkpoint's, or calibrated on the prompts for synthetic weights)")
    p.add_argument("--engine", choices=ENGINES, default="pcg",
                   help="the runtime under test: pcg's engine, or SGLang servers (graphs on against off)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=DTYPE_NAMES, help="default: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--max-tokens", type=bounded_int(1, MAX_TOKENS, "a token count"),
                   help=f"largest token bucket, 1 to {MAX_TOKENS} (its buffers are allocated up front); default "
                        f"{GPU_MAX_TOKENS} on cuda, {CPU_MAX_TOKENS} on cpu (a tiny model's minutes go to a GPU-sized ladder)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the synthetic weights and the prompts")
    p.add_argument("--max-new-tokens", type=positive_int, default=8, help="greedy decode steps per prompt, each judged")
    p.add_argument("--top-k", type=positive_int, default=5, help="top-k logprobs kept per position for the judge")
    p.add_argument("--logprob-tol", type=positive_float, help="max |Δlogprob| where tokens agree (default: per dtype)")
    p.add_argument("--memory-share", type=share_float, default=0.10,
                   help="the graph pool's share of the KV cache's room (beside the weights) past which the verdict "
                        "carries a memory line; 0 < share ≤ 1 (GPU cells)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="run the cell in N fresh processes and keep the worst (flakiness that fires in some processes)")
    p.add_argument("--json", action="store_true",
                   help="print the outcome and the spec that produced it as one JSON object")
    p.set_defaults(handler=run)


def _quant(text: str) -> str:
    """A known scheme (pcg_core.known), else an error with the nearest names: a typo must not become a cell."""
    if text not in KNOWN_QUANTIZATION:
        near = difflib.get_close_matches(text, KNOWN_QUANTIZATION, n=3)
        hint = f"did you mean {', '.join(near)}? " if near else ""
        raise argparse.ArgumentTypeError(f"unknown quantization {text!r}; {hint}known: {', '.join(KNOWN_QUANTIZATION)}")
    return quant_registry.canonical(text)  # an alias (fp4) runs, and is recorded, as its scheme (nvfp4)


def _parallel(text: str) -> str:
    try:
        world_size(text)  # the grammar (parse_parallel), and degrees that nest
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def spec_from_args(args: argparse.Namespace) -> CellSpec:
    """The cell `pcgh cell` runs: one flag per CellSpec field a matrix sets, so a cell's repro command
    (harness.repro) reruns exactly that cell."""
    from harness.cell import CellSpec

    return CellSpec(model=args.model, graph=args.graph, attention=args.attention, device=args.device, dtype=args.dtype,
                    layers=args.layers, tiny=args.tiny, weights=args.weights,
                    max_tokens=args.max_tokens,
                    compiler=args.compiler, quant=args.quant, parallel=args.parallel, kv_cache=args.kv_cache,
                    engine=args.engine, seed=args.seed,
                    max_new_tokens=args.max_new_tokens, top_k=args.top_k, logprob_tol=args.logprob_tol,
                    peaked=not args.flat_weights, memory_share=args.memory_share)


def run(args: argparse.Namespace) -> int:
    with _stacks_on_term():
        return _run(args)


@contextmanager
def _stacks_on_term() -> Iterator[None]:
    """While the cell runs, SIGTERM (`timeout`, a device call's cell list running out of time) first writes every
    thread's Python stack to stderr, then ends the process as before: where a cell hung is then on record. (A
    Mixtral-8x7B nvfp4 cell ran 430 s on the H100 and was killed with nothing written, 2026-12-07f.) Only over the
    default action: a handler someone else installed stays theirs. Signal the cell once: chaining leaves SIGTERM
    unblocked in its own handler, so a second one (plain `timeout` signals the child, then its whole group) ends the
    process mid-dump; benchmarks/gpu_cells.sh uses `timeout --foreground`."""
    armed = (threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
             and _has_fileno(sys.stderr))  # faulthandler writes to a file descriptor (not to a test's captured stream)
    if armed:
        faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    try:
        yield
    finally:
        if armed:
            faulthandler.unregister(signal.SIGTERM)


def _has_fileno(stream: object) -> bool:
    fileno = getattr(stream, "fileno", None)
    try:
        return fileno is not None and isinstance(fileno(), int)
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return False


def _run(args: argparse.Namespace) -> int:
    from harness.cell import run_cell
    from harness.cell.run import runtime_reason
    from harness.launcher.watch import phase_marks

    spec = spec_from_args(args)
    ranks = world_size(spec.parallel)  # checked by _parallel already
    if spec.engine == "sglang":
        outcome = _sglang(spec, ranks)
    elif args.repeats == 1 and (ranks == 1 or runtime_reason(spec)):  # refused here, before any rank is started
        outcome = run_cell(spec, on_phase=phase_marks())
    else:  # fresh processes: each repeat one, or a parallel cell one per rank
        outcome = _run_repeated(spec, args.repeats, ranks)
    if args.json:  # the outcome, with the spec that produced it
        print(json.dumps({"spec": asdict(spec), **json.loads(outcome.to_json())}))
    else:
        _print(spec, outcome)
    return EXIT_PASS if outcome.passed else EXIT_FAIL


def _sglang(spec: CellSpec, ranks: int) -> CellOutcome:
    """An SGLang cell in this process (its servers are processes of their own), unless it cannot run here."""
    import tempfile
    from pathlib import Path

    import torch

    from harness.outcome import CellOutcome, Status
    from harness.sglang.cell import run_sglang_cell
    from harness.sglang.precheck import sglang_reason

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if reason := sglang_reason(spec, ranks, gpus):
        return CellOutcome(status=Status.UNSUPPORTED, reason=reason)
    with tempfile.TemporaryDirectory(prefix="pcg-sglang-") as work:
        return run_sglang_cell(spec, Path(work))


def _run_repeated(spec: CellSpec, repeats: int, ranks: int = 1) -> CellOutcome:
    """The cell in `repeats` fresh worker processes (the matrix launcher's, logs in a temporary folder), merged; a
    cell of several ranks as that many workers each time, on GPUs 0…ranks−1 of those visible (CUDA). A CUDA cell
    that needs more GPUs than are visible is unsupported, saying how many it needs, and not launched."""
    import tempfile
    from pathlib import Path

    from harness.launcher.process import launch_repeated
    from harness.matrix import Cell
    from harness.matrix.precheck import needs_gpus
    from harness.matrix.schema import Defaults
    from harness.outcome import CellOutcome, Status, cell_key

    axes = {"model": spec.model, "quant": spec.quant, "attention": spec.attention, "parallel": spec.parallel,
            "graph": spec.graph, "compiler": spec.compiler, "kv_cache": spec.kv_cache, "engine": spec.engine}
    cell = Cell(cell_key(axes), axes, spec, Defaults().timeout_s)
    gpus = None
    if spec.device.startswith("cuda") and ranks > 1:
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < ranks:
            return CellOutcome(status=Status.UNSUPPORTED, reason=f"{needs_gpus(ranks)} ({spec.parallel}: one per rank, "
                                                                 f"on one host), {have} visible on this machine")
        gpus = list(range(ranks))
    with tempfile.TemporaryDirectory(prefix="pcgh-cell-") as logs:
        record = launch_repeated(cell, Path(logs) / "cell.log", gpus, repeats)
    return CellOutcome.model_validate(record.model_dump(include=set(CellOutcome.model_fields)))


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _print(spec: CellSpec, o: CellOutcome) -> None:
    from rich.console import Console
    from rich.table import Table

    console, m = Console(), o.metrics
    colour = "green" if o.passed else "yellow" if o.status == "unsupported" else "red"
    console.print(f"[bold {colour}]{o.status}[/] {spec.model} quant={spec.quant} attention={spec.attention} "
                  f"parallel={spec.parallel} graph={spec.graph} compiler={spec.compiler} kv_cache={spec.kv_cache} "
                  f"{m.settings.device} {m.settings.dtype} layers={m.settings.layers}" + (f" — {o.reason}" if o.reason else ""))
    if m.judge.reference is not None:  # measured before capture: shown even when the cell ended there
        ref_colour = {"pass": "green", "fail": "red"}.get(m.judge.reference.status, "yellow")
        console.print(f"[{ref_colour}]reference layer[/]: {m.judge.reference.summary()}")
    if m.capture.pieces is None:
        return  # ended before capture: nothing measured
    pool = None if m.capture.graph_pool_bytes is None else m.capture.graph_pool_bytes / 2**20
    console.print(f"pieces {m.capture.pieces}, graphs {m.capture.graphs_captured}, trace {_num(m.capture.trace_s)}s, "
                  f"capture {_num(m.capture.capture_s)}s, pool {_num(pool, '.1f')} MiB, token match {_num(m.judge.token_match, '.3f')}, "
                  f"max logprob diff prompt {m.judge.max_prompt_logprob_diff} output {m.judge.max_output_logprob_diff}, "
                  f"eager fallbacks {m.capture.eager_fallbacks}")
    if m.capture.attention_kernels:
        console.print(f"attention kernels built {m.capture.attention_kernels} ({m.capture.attention_kernels_in_run} in the "
                      f"run phase), {_num(m.capture.attention_build_s)}s")
    if m.coverage is not None:
        console.print(f"coverage: {m.coverage.summary()}")
    if m.process.repeats:
        console.print(f"repeats: {m.process.repeats} fresh processes: {', '.join(m.process.repeat_statuses)}")
    if m.process.rank_statuses:
        console.print(f"ranks: {len(m.process.rank_statuses)} processes" + (f" on {m.process.gpus} GPUs" if m.process.gpus else "")
                      + f": {', '.join(m.process.rank_statuses)} (the outcome is rank 0's)")
    if m.judge.diagnosis_error:
        console.print(f"[red]diagnosis failed[/] (the verdict stands): {m.judge.diagnosis_error}")
    if m.latency.latency_ms:
        t = Table("tokens", "eager ms", "graph ms", "speedup")
        for n, lat in m.latency.latency_ms.items():
            t.add_row(str(n), _num(lat.eager), _num(lat.graph), f"{_num(m.latency.speedup.get(n))}x")
        console.print(t)
