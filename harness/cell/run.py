"""run_cell: load, eager reference, graph candidate, judge, latency — one phase each, one CellOutcome out.

`pcgh cell` runs this in-process; the matrix launcher runs the same code in a child process per cell. A phase
that cannot go on raises `Stop` with the status it ends the cell in; whatever was measured before it is kept.
The phases run the judge's layers; its policy composes them and numbers them (harness/cell/judge/policy.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from harness.cards import find_card
from harness.cell.coverage import CoverageCounter
from harness.cell.crash import Stop, crash
from harness.cell.judge.kv_reference import checkpoint_kv_scales
from harness.cell.judge.policy import eager_self_check, judge, reference_check, with_reference
from harness.cell.judge.tolerances import LOGPROB_TOL
from harness.cell.memory import memory_budget, memory_fit, weights_bytes
from harness.cell.parallel import keep_rank_part, parallel_group, tp1_check
from harness.cell.prompts import (CONCURRENCY, CPU_CONCURRENCY, Case, latency_token_counts, prompt_suite,
                                  prefix_cacheable, run_case)
from harness.cell.spec import CellSpec, resolve_model
from harness.cell.timing import median_ms
from harness.metrics import CellMetrics, Latency
from harness.outcome import CellOutcome, Status
from pcg_core.attention import get_attention_backend
from pcg_core.capabilities import (attention_unsupported_reason, kv_cache_unsupported_reason, parallel_unsupported_reason,
                                   quant_unsupported_reason)
from pcg_core.config import CaptureConfig, EngineConfig
from pcg_core.distributed import ParallelGroup, rank_device
from pcg_core.distributed.quant import scheme_for_shards
from pcg_core.engine import Engine, SequenceOutput
from pcg_core.engine.kv_scales import ATTRIBUTE, calibrate_kv_scales, set_kv_scales
from pcg_core.errors import ConfigError, UnsupportedModel
from pcg_core.known import parse_parallel
from pcg_core.model import LoadedModel, load_model
from pcg_core.model.vision import is_vlm, text_token_limit
from pcg_core.quant import get_scheme, quantize_model, quantized_modules, record_input_absmax
from pcg_core.quant.synthetic_weights import make_realistic_

Outputs = dict[str, list[SequenceOutput]]



@dataclass
class _Cell:
    """What the phases share: the spec, the engine config, the model, the prompt suite and the metrics so far (the
    judge reads it as a judge.policy.Cell)."""

    spec: CellSpec
    config: EngineConfig
    metrics: CellMetrics
    lm: LoadedModel | None = None
    cases: list[Case] | None = None
    kv_slots: int = 0
    coverage: CoverageCounter | None = None
    group: ParallelGroup | None = None  # this rank's tensor-parallel group (None: one process)
    float_ref: list[SequenceOutput] | None = None  # the unquantized model's first case, for the quantization error
    input_absmax: dict[str, float] | None = None  # a synthetic model's calibration (tp1 requantizes with it)

    def engine(self, backend: str, kv_cache: str | None = None) -> Engine:
        """An engine on the cell's model (kv_cache: another KV-cache dtype than the cell's, for calibration)."""
        capture = replace(self.config.capture, backend=backend)
        return Engine(self.loaded.model, replace(self.config, capture=capture, kv_slots=self.kv_slots,
                                             kv_cache=kv_cache or self.config.kv_cache))

    def run_suite(self, e: Engine, listener: CoverageCounter | None = None, cases: list[Case] | None = None) -> Outputs:
        e.on_forward = listener
        try:
            return {c.name: run_case(e, c, self.spec.top_k) for c in (self.suite if cases is None else cases)}
        finally:
            e.on_forward = None

    @property
    def loaded(self) -> LoadedModel:
        """The model, once _load has set `lm` (every later phase reads it)."""
        assert self.lm is not None, "the cell's model is read before it is loaded"
        return self.lm

    @property
    def suite(self) -> list[Case]:
        """The prompt suite, once _load has set `cases`."""
        assert self.cases is not None, "the cell's prompt suite is read before it is built"
        return self.cases

    @property
    def tol(self) -> float:
        return self.spec.logprob_tol if self.spec.logprob_tol is not None else LOGPROB_TOL[self.spec.resolved_dtype]


def recorded_settings(spec: CellSpec) -> CellMetrics:
    """The metrics a cell starts with: its run settings, which harness.repro turns back into the `pcgh cell`
    command (the axes give the rest), so they are recorded even when the cell ends before measuring anything."""
    return CellMetrics(device=spec.device, dtype=spec.dtype, layers=spec.layers, tiny=spec.tiny, weights=spec.weights,
                       kv_cache=spec.kv_cache,
                       max_tokens=spec.max_tokens, max_new_tokens=spec.max_new_tokens, seed=spec.seed, top_k=spec.top_k,
                       logprob_tol=spec.logprob_tol, peaked=spec.peaked, memory_share=spec.memory_share)


def runtime_reason(spec: CellSpec) -> str | None:
    """Why the runtime cannot run `spec` (a quantization or parallel mode it lacks, an attention backend that cannot
    run here or cannot run what the model card says it exercises), or None: what the matrix pre-check would say,
    known before a model is loaded or a rank started."""
    if spec.engine != "pcg":  # the matrix's pre-check and `pcgh cell` send those to their engine's own runner
        return f"run_cell runs pcg's engine; an {spec.engine} cell runs under harness/{spec.engine}/"
    card = find_card(spec.model)
    features = card.features if card else ()
    reason = (quant_unsupported_reason(spec.quant, features=features, real_weights=spec.weights == "real")
              or ((card.no_checkpoint_reason(spec.quant) or card.checkpoint_reason(spec.quant))
                  if card and spec.weights == "real" else None)
              or parallel_unsupported_reason(spec.parallel, graph=spec.graph))
    return reason or attention_unsupported_reason(spec.attention, spec.device, features) or \
        kv_cache_unsupported_reason(spec.kv_cache, spec.attention)


def _check_runtime(spec: CellSpec) -> None:
    """A cell the runtime cannot run ends as the matrix pre-check would have, before the model is loaded; running
    the unquantized single-GPU cell instead would pass under the wrong name."""
    if reason := runtime_reason(spec):
        raise Stop(Status.UNSUPPORTED, reason)


def _load(cell: _Cell) -> None:
    s = cell.spec
    try:
        cell.lm = load_model(resolve_model(s), layers=s.layers, tiny=s.tiny, weights=s.weights,
                             dtype=cell.config.torch_dtype, device=s.device, seed=s.seed, peaked=s.peaked)
    except UnsupportedModel as e:
        raise Stop(Status.UNSUPPORTED, str(e)) from e
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to build the model means eager cannot run
        raise crash(Status.EAGER_FAIL, e) from e
    text = cell.lm.config.get_text_config()  # a VLM's text model (the config itself for a text-only one)
    cell.metrics.settings.layers = text.num_hidden_layers
    cell.metrics.quant.checkpoint_kv_scales = checkpoint_kv_scales(cell.lm.model)
    vocab = text_token_limit(cell.lm.config) if is_vlm(cell.lm.config) else text.vocab_size
    page = cell.config.page_size or get_attention_backend(cell.config.attention).page_size
    cell.cases = prompt_suite(cell.config.capture.ladder, vocab, seed=s.seed, max_new_tokens=s.max_new_tokens,
                              model_config=cell.lm.config,
                              concurrency=CONCURRENCY[-1] if s.device.startswith("cuda") else CPU_CONCURRENCY,
                              page_size=page if prefix_cacheable(text, s.parallel) else None)
    need = max(c.kv_slots(page) for c in cell.cases)
    cell.kv_slots = max(need, -(-max(latency_token_counts(s.resolved_max_tokens), default=0) // page) * page) + page
    # a linear-attention model's state slots: one per live sequence of the most concurrent case
    live = max(len(c.prompts) for c in cell.cases)
    cell.config = replace(cell.config, linear_state_slots=max(cell.config.linear_state_slots, live))
    if s.quant != "none":
        _quantize(cell)
    elif not cell.loaded.synthetic and (got := sorted(set(quantized_modules(cell.loaded.model).values()))):
        raise Stop(Status.UNSUPPORTED, f"the checkpoint's weights are {', '.join(got)}; the cell asks for none (a 16-bit "
                                        "model): run it as quant " + got[0])
    if s.kv_cache != "auto":
        _kv_scales(cell)
    if cell.group is not None:  # every rank built, quantized and calibrated the same full model: each keeps its part
        try:
            cell.metrics.settings.expert_dispatch = keep_rank_part(cell.loaded.model, cell.group, s)
        except UnsupportedModel as e:
            raise Stop(Status.UNSUPPORTED, str(e)) from e


def _kv_scales(cell: _Cell) -> None:
    """An FP8 KV cache's per-layer scales: the checkpoint's where it declares them (the loader set
    `pcg_kv_scales`), else calibrated on the first case's prompts with a 16-bit KV cache (absmax / 448), after
    quantization (K and V are the quantized model's), as a producer or a serving engine computes them."""
    model = cell.loaded.model
    if getattr(model, ATTRIBUTE, None) is not None:
        cell.metrics.quant.kv_scales = "checkpoint"
        if (read := cell.metrics.quant.checkpoint_kv_scales) is not None:  # the checkpoint's scales, now in use
            cell.metrics.quant.checkpoint_kv_scales = read.model_copy(update={"applied": True})
        return
    case = cell.suite[0]
    try:
        scales = calibrate_kv_scales(cell.engine("disabled", kv_cache="auto"), [list(p) for p in case.prompts],
                                     list(case.new_tokens))
        set_kv_scales(model, scales)
    except Exception as e:  # noqa: BLE001 - the 16-bit forwards failed: eager cannot run either
        raise crash(Status.EAGER_FAIL, e) from e
    cell.metrics.quant.kv_scales = "calibrated"


def _quantize(cell: _Cell) -> None:
    """The cell's scheme applied: a real checkpoint must already be in it (the loader read its declaration); a
    synthetic model is quantized here (its linears and fused MoE experts), static activation scales calibrated on
    the first case's prompts, as a producer would. The float model's prompt logprobs on that case are kept, to
    record the quantization error."""
    s, m = cell.spec, cell.metrics
    model = cell.loaded.model
    if not cell.loaded.synthetic:
        quantized = quantized_modules(model)
        got = sorted(set(quantized.values()))
        if got != [s.quant]:
            raise Stop(Status.UNSUPPORTED, f"the checkpoint's weights are {', '.join(got) or 'not quantized'}; the cell asks "
                                            f"for {s.quant}")
        m.quant.quant_layers = len(quantized)  # linears and experts modules, as quantize_model counts them
        return
    case = cell.suite[0]
    # Scales that vary by row, column and block as a trained checkpoint's do (10–100×, outliers): near-uniform
    # random weights quantize to near-uniform scales, under which a mis-indexed scale barely moves the output.
    make_realistic_(model, s.seed)
    try:
        with record_input_absmax(model) as absmax:
            cell.float_ref = cell.run_suite(cell.engine("disabled", kv_cache="auto"), cases=[case])[case.name]
        cell.input_absmax = absmax
        m.quant.quant_layers = len(quantize_model(model, scheme_for_shards(get_scheme(s.quant), model, parse_parallel(s.parallel).get("tp", 1)),
                                              input_absmax=absmax))
    except NotImplementedError as e:  # a layout the quantizer declines (gpt-oss's biased, transposed experts)
        raise Stop(Status.UNSUPPORTED, f"quantization {s.quant}: {e}") from e
    except Exception as e:  # noqa: BLE001 - the float reference or the quantization itself failed: eager cannot run
        raise crash(Status.EAGER_FAIL, e) from e


def _quant_error(cell: _Cell, ref: Outputs) -> None:
    """Max |Δ prompt logprob| of the quantized eager run against the float model's, on the first case: what the
    scheme costs, recorded beside the verdict, never judged (the judge compares quantized graph with quantized
    eager)."""
    if cell.float_ref is None:
        return
    worst = 0.0
    for a, b in zip(cell.float_ref, ref[cell.suite[0].name]):
        worst = max([worst, *(abs(x - y) for x, y in zip(a.prompt_logprobs or [], b.prompt_logprobs or []))])
    cell.metrics.quant.quant_logprob_diff = round(worst, 6)


def _eager_reference(cell: _Cell) -> tuple[Engine, Outputs]:
    """Layer 1: eager twice, judged against itself (judge.policy.eager_self_check); a crash is eager_fail."""
    try:
        eager = cell.engine("disabled")
        ref, ref2 = cell.run_suite(eager), cell.run_suite(eager)
    except Exception as e:  # noqa: BLE001
        raise crash(Status.EAGER_FAIL, e) from e
    _quant_error(cell, ref)
    eager_self_check(cell, ref, ref2)
    return eager, ref


def _tp1(cell: _Cell, ref: Outputs) -> None:
    """Layer 7: a tensor-parallel cell's eager against the same weights unsharded in this process
    (parallel.tp1_check)."""
    s, case = cell.spec, cell.suite[0]
    try:
        diff, problem = tp1_check(s, replace(cell.config, kv_slots=cell.kv_slots), case, ref[case.name], cell.tol,
                                  cell.input_absmax)
    except Exception as e:  # noqa: BLE001 - the unsharded model is eager too
        raise crash(Status.EAGER_FAIL, e) from e
    cell.metrics.judge.tp1_logprob_diff = round(diff, 9)
    if problem:
        raise Stop(Status.FAIL_ACCURACY, problem)


def _reference(cell: _Cell, ref: Outputs) -> None:
    """Layer 6, the reference layer (judge/reference.py): eager against transformers' forward and the kernels'
    reference math, before capture, while the GPU holds only the model and eager's cache."""
    reference_check(cell, replace(cell.config, kv_slots=cell.kv_slots), ref)


def _candidate(cell: _Cell, on_phase: Callable[[str], None]) -> tuple[Engine, Outputs]:
    """Layer 2: capture, then run the suite; a crash in either is classified by where it happened."""
    m = cell.metrics
    try:
        graph = cell.engine(cell.spec.graph)
    except ConfigError as e:
        raise Stop(Status.UNSUPPORTED, str(e)) from e
    except Exception as e:  # noqa: BLE001
        raise crash(Status.FAIL_CAPTURE, e) from e
    st, c = graph.stats, m.capture
    c.pieces, c.graphs_captured, c.trace_s, c.capture_s = st.pieces, st.graphs_captured, st.trace_s, st.capture_s
    c.compile_s, c.graph_pool_bytes = st.compile_s, st.graph_pool_bytes
    m.memory.kv_bytes_per_token = graph.cache.bytes_per_token
    m.memory.weights_bytes = weights_bytes(cell.loaded.model)
    at_capture, _ = graph.attn_backend.kernels_built()
    on_phase("run")
    cell.coverage = CoverageCounter(cell.config.capture.ladder)
    try:
        cand = cell.run_suite(graph, cell.coverage)
    except Exception as e:  # noqa: BLE001
        raise crash(Status.FAIL_RUN, e) from e
    c.eager_fallbacks, c.bucket_hits = st.eager_fallbacks, dict(sorted(st.bucket_hits.items()))
    kernels, build_s = graph.attn_backend.kernels_built()
    c.attention_kernels, c.attention_kernels_in_run, c.attention_build_s = kernels, kernels - at_capture, round(build_s, 3)
    return graph, cand


def _judge(cell: _Cell, eager: Engine, graph: Engine, ref: Outputs, cand: Outputs) -> tuple[Status, str]:
    """Layers 3-5 (judge.policy.judge), a phase of its own: the lockstep and the padding checks take over a minute on a
    big MoE in half precision (DeepSeek-V3:4 flex on the H100, 2026-12-07), which the run phase's clock used to hold."""
    try:
        judgement = judge(cell, eager, graph, ref, cand)
    except Exception as e:  # noqa: BLE001 - the lockstep re-runs the graph: a crash there is the graph's
        raise crash(Status.FAIL_RUN, e) from e
    return judgement.status, judgement.reason


def _latency(cell: _Cell, eager: Engine, graph: Engine) -> None:
    """Prefill latency of eager and graph side by side, at each latency token count, in this one process."""
    s = cell.spec
    repeat = s.latency_repeat or (20 if s.device.startswith("cuda") else 5)
    gen = torch.Generator().manual_seed(s.seed + 1)
    for n in latency_token_counts(s.resolved_max_tokens):
        prompt = torch.randint(0, cell.loaded.config.get_text_config().vocab_size, (n,), generator=gen).tolist()
        ms = {}
        for side, e in (("eager", eager), ("graph", graph)):
            batch = e.prefill_batch([prompt])
            ms[side] = round(median_ms(lambda: e.forward(batch), e.device, warmup=2, repeat=repeat), 4)
        cell.metrics.latency.latency_ms[n] = Latency(**ms)
        cell.metrics.latency.speedup[n] = round(ms["eager"] / ms["graph"], 3) if ms["graph"] > 0 else None


def _engine_config(spec: CellSpec) -> EngineConfig:
    """The engines' config the spec asks for (each engine sets its own capture backend: _Cell.engine)."""
    capture = CaptureConfig(backend=spec.graph, compiler=spec.compiler, max_tokens=spec.resolved_max_tokens)
    return EngineConfig(device=spec.device, dtype=spec.resolved_dtype, attention=spec.attention, capture=capture,
                        kv_cache=spec.kv_cache)


def _with_notes(metrics: CellMetrics, spec: CellSpec, reason: str) -> str:
    """The reason with the facts the verdict's reader needs beside it (checkpoint scales unused, the graphs'
    memory); the status stands."""
    notes = [metrics.quant.checkpoint_kv_scales.summary()] if metrics.quant.checkpoint_kv_scales is not None else []
    if metrics.capture.graph_pool_bytes is not None and (line := memory_fit(metrics, memory_budget(spec.device), spec.memory_share)):
        notes.append(line)  # what the graphs cost the context: the verdict stands
    if notes:
        reason = "; ".join([reason, *notes] if reason else notes)[:2000]
    return reason


def run_cell(spec: CellSpec, on_phase: Callable[[str], None] | None = None) -> CellOutcome:
    """The cell's outcome; raises ConfigError only for bad input.

    on_phase(name) is told when each phase starts (load, eager, reference, capture, run, judge, latency), so a
    parent process can tell where a child that died without a result was.

    A tensor-parallel cell (parallel tpN) is N processes, each calling run_cell(spec) with RANK, WORLD_SIZE=N,
    LOCAL_RANK, MASTER_ADDR and MASTER_PORT set: every rank runs every phase in lockstep (the collectives pair up)
    and returns the same outcome, rank 0's being the one recorded. Device `cuda` becomes this rank's GPU.
    """
    running: list = []  # [name, start] of the phase whose clock runs

    def close_phase() -> None:
        """The running phase's seconds into metrics.process.phase_s: where a cell's time goes."""
        if running:
            metrics.process.phase_s[running[0]] = round(time.perf_counter() - running[1], 3)
            running.clear()

    def phase(name: str) -> None:
        close_phase()
        running.extend([name, time.perf_counter()])
        if on_phase is not None:
            on_phase(name)

    metrics = recorded_settings(spec)  # as asked (`cuda`), not this rank's device
    spec = replace(spec, device=rank_device(spec.device))
    cell = _Cell(spec, _engine_config(spec), metrics)
    t0 = time.perf_counter()
    try:
        _check_runtime(spec)
        cell.group = parallel_group(spec)
        phase("load")
        _load(cell)
        phase("eager")
        eager, ref = _eager_reference(cell)
        if cell.group is not None and cell.loaded.synthetic:
            _tp1(cell, ref)
        phase("reference")
        _reference(cell, ref)
        phase("capture")
        graph, cand = _candidate(cell, phase)
        phase("judge")
        status, reason = with_reference(cell.metrics, *_judge(cell, eager, graph, ref, cand))
        phase("latency")
        try:
            _latency(cell, eager, graph)
        except Exception as e:  # noqa: BLE001 - the graph crashed while timed: a run failure, the verdict kept beside it
            stop = crash(Status.FAIL_RUN, e)
            status, reason = stop.status, f"latency: {stop.reason}; judge: {status}{': ' + reason if reason else ''}"[:2000]
    except Stop as stop:
        status, reason = with_reference(metrics, stop.status, stop.reason)
    reason = _with_notes(metrics, spec, reason)
    close_phase()
    metrics.process.cell_s = round(time.perf_counter() - t0, 3)
    if spec.device.startswith("cuda") and torch.cuda.is_initialized():
        metrics.process.peak_gpu_bytes = torch.cuda.max_memory_reserved(spec.device)
    return CellOutcome(status=status, reason=reason, metrics=metrics, duration_s=metrics.process.cell_s)
