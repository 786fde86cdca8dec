"""One cell: an eager reference and a graph candidate on the same weights, the prompt suite, the judge.

`pcgh cell` runs this in-process; the matrix launcher runs the same code in a child process per cell.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from harness.cards import find_card
from harness.diagnose import first_diverging_piece, max_prompt_kl
from harness.judge import KL_TOL, LOGPROB_TOL, PIECE_RTOL, compare, outputs_identical
from harness.prompts import latency_token_counts, prompt_suite
from pcg_core import CaptureConfig, ConfigError, Engine, EngineConfig, load_model
from pcg_core.engine.timing import median_ms
from pcg_core.model import UnsupportedModel


@dataclass
class CellSpec:
    model: str
    graph: str = "piecewise"
    attention: str = "sdpa"
    device: str = "cpu"
    dtype: str | None = None  # default: float32 on cpu, bfloat16 on cuda
    layers: int | None = None
    tiny: bool = False
    weights: str = "auto"
    max_tokens: int = 4096
    compiler: str = "eager"
    seed: int = 0
    max_new_tokens: int = 8
    top_k: int = 5
    logprob_tol: float | None = None
    latency_repeat: int | None = None

    def __post_init__(self) -> None:
        if self.dtype is None:
            self.dtype = "bfloat16" if self.device.startswith("cuda") else "float32"


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def _crash(status: str, e: BaseException) -> tuple[str, str]:
    return ("oom" if _is_oom(e) else status), f"{type(e).__name__}: {e}"[:2000]


def resolve_model(spec: CellSpec) -> str | dict[str, Any]:
    """A card id becomes its real config (synthetic weights, or its hub id with --weights real)."""
    card = find_card(spec.model)
    if card is None:
        return spec.model
    return card.hub_id if spec.weights == "real" else card.config


def run_cell(spec: CellSpec, on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Returns the cell's result; raises ConfigError only for bad input.

    on_phase(name) is told when each phase starts (load, eager, capture, run, latency), so a parent process
    can tell where a child that died without a result was.
    """
    phase = on_phase or (lambda name: None)
    result: dict[str, Any] = {
        "status": None, "reason": "", "model": spec.model, "graph": spec.graph, "attention": spec.attention,
        "compiler": spec.compiler, "device": spec.device, "dtype": spec.dtype, "layers": spec.layers, "tiny": spec.tiny,
        "weights": spec.weights, "max_tokens": spec.max_tokens, "max_new_tokens": spec.max_new_tokens,
        "pieces": 0, "graphs_captured": 0, "trace_s": 0.0, "capture_s": 0.0, "compile_s": 0.0, "graph_pool_bytes": 0,
        "token_match": 0.0, "max_prompt_logprob_diff": None, "max_output_logprob_diff": None,
        "topk_containment_ok": None, "latency_ms": {}, "speedup": {}, "eager_fallbacks": 0, "bucket_hits": {},
    }
    capture = CaptureConfig(backend=spec.graph, compiler=spec.compiler, max_tokens=spec.max_tokens)
    EngineConfig(device=spec.device, dtype=spec.dtype, attention=spec.attention, capture=capture)  # validate flags
    source = resolve_model(spec)
    t0 = time.perf_counter()

    def done(status: str, reason: str = "") -> dict[str, Any]:
        result.update(status=status, reason=reason, duration_s=round(time.perf_counter() - t0, 3))
        return result

    phase("load")
    try:
        lm = load_model(source, layers=spec.layers, tiny=spec.tiny, weights=spec.weights,
                        dtype=EngineConfig(dtype=spec.dtype).torch_dtype, device=spec.device, seed=spec.seed)
    except UnsupportedModel as e:
        return done("unsupported", str(e))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to build the model means eager cannot run
        return done(*_crash("eager_fail", e))
    result["layers"] = lm.config.num_hidden_layers
    cases = prompt_suite(capture.ladder, lm.config.vocab_size, seed=spec.seed)
    kv_slots = max(sum(len(p) + spec.max_new_tokens for p in prompts) for prompts in cases.values())
    kv_slots = max(kv_slots, max(latency_token_counts(spec.max_tokens), default=0)) + 16

    def engine(backend: str) -> Engine:
        cfg = CaptureConfig(backend=backend, compiler=spec.compiler, max_tokens=spec.max_tokens)
        return Engine(lm.model, EngineConfig(device=spec.device, dtype=spec.dtype, attention=spec.attention, capture=cfg, kv_slots=kv_slots))

    def run_suite(e: Engine) -> dict[str, list]:
        return {name: e.generate(prompts, spec.max_new_tokens, spec.top_k, prompt_logprobs=True) for name, prompts in cases.items()}

    # Layer 1: eager twice
    phase("eager")
    try:
        eager = engine("disabled")
        ref = run_suite(eager)
        ref2 = run_suite(eager)
    except Exception as e:  # noqa: BLE001
        return done(*_crash("eager_fail", e))
    # Eager's own noise floor. Bitwise-equal runs are the norm; on a GPU, decode steps have been seen to flip
    # bf16 near-ties between runs. If eager-vs-eager passes the same judge the graph faces, the graph can be
    # judged; if not, the cell cannot tell graph bugs from eager noise.
    tol = spec.logprob_tol if spec.logprob_tol is not None else LOGPROB_TOL[spec.dtype]
    result["eager_bitwise_deterministic"] = outputs_identical(list(ref.values()), list(ref2.values()))
    if not result["eager_bitwise_deterministic"]:
        self_check = compare(ref, ref2, tol)
        result["eager_self_diff"] = {"token_match": self_check.token_match, "max_prompt_logprob_diff": self_check.max_prompt_logprob_diff,
                                     "max_output_logprob_diff": self_check.max_output_logprob_diff}
        if self_check.status != "pass":
            return done("eager_nondeterministic", f"two eager runs of the same prompts differ beyond the judge's bounds: {self_check.reason}")

    # Layer 2: capture, then run
    phase("capture")
    try:
        graph = engine(spec.graph)
    except ConfigError as e:
        return done("unsupported", str(e))
    except Exception as e:  # noqa: BLE001
        return done(*_crash("fail_capture", e))
    st = graph.stats
    result.update(pieces=st.pieces, graphs_captured=st.graphs_captured, trace_s=st.trace_s, capture_s=st.capture_s,
                  compile_s=st.compile_s, graph_pool_bytes=st.graph_pool_bytes)
    phase("run")
    try:
        cand = run_suite(graph)
    except Exception as e:  # noqa: BLE001
        return done(*_crash("fail_run", e))
    result.update(eager_fallbacks=st.eager_fallbacks, bucket_hits={str(k): v for k, v in sorted(st.bucket_hits.items())})

    # Layers 3-4: tokens, containment, logprobs, KL at prompt positions
    verdict = compare(ref, cand, tol)
    result.update({k: v for k, v in asdict(verdict).items() if k not in ("status", "reason")})
    kl_tol = KL_TOL[spec.dtype]
    result["max_prompt_kl"] = max(max_prompt_kl(eager, graph, prompts) for prompts in cases.values())
    if result["max_prompt_kl"] > kl_tol:
        extra = f"prompt KL {result['max_prompt_kl']:.3g} > {kl_tol:g}"
        verdict.status, verdict.reason = "fail_accuracy", f"{verdict.reason}; {extra}" if verdict.status != "pass" else extra
    # Layer 5: on failure, name the first piece that diverges
    if verdict.status == "fail_accuracy":
        for name, prompts in cases.items():
            where = first_diverging_piece(graph, prompts, PIECE_RTOL[spec.dtype])
            if where.startswith("first diverging") or name == list(cases)[-1]:
                verdict.reason += f"; {name}: {where}"
                break

    # Latency, side by side
    phase("latency")
    repeat = spec.latency_repeat or (20 if spec.device.startswith("cuda") else 5)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    for n in latency_token_counts(spec.max_tokens):
        prompt = torch.randint(0, lm.config.vocab_size, (n,), generator=gen).tolist()
        lat = {}
        for name, e in (("eager", eager), ("graph", graph)):
            batch = e.prefill_batch([prompt])
            lat[name] = round(median_ms(lambda: e.forward(batch), e.device, warmup=2, repeat=repeat), 4)
        result["latency_ms"][str(n)] = lat
        result["speedup"][str(n)] = round(lat["eager"] / lat["graph"], 3) if lat["graph"] > 0 else None
    return done(verdict.status, verdict.reason)
