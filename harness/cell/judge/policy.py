"""The judge's policy: one verdict on a cell, composed from its layers, which this docstring numbers for every other.

1. **Eager against itself** (eager_self_check): eager runs the suite twice; beyond the judge's bounds the cell is
   eager_nondeterministic (it cannot tell graph bugs from eager noise), within them the difference widens the
   near-tie margin (tokens.py's rule, tolerances.tie_margin).
2. **The graph runs**: capture, then the suite; a crash in either is classified by where it happened
   (harness/cell/run.py's _candidate, harness/cell/crash.py).
3. **Lockstep** (lockstep.py): each case on both engines, each on its own KV cache: KL at prompt and decode
   positions, and the graph against eager at the graph's own padding (tolerances.same_padding_rtol).
4. **Tokens and logprobs** against unpadded eager (tokens.py), the bound widened to eager's own padding noise only
   where float32 shows that padding exact (padding.py); a failure there is excused when the graph equals eager at
   its padding at every forward and the failing cases' padding is exact (_excuse_padding).
5. **The first diverging piece** (lockstep.py), on failure: the diagnosis, recorded beside the verdict, never over
   it.
6. **The reference layer** (reference.py, kv_reference.py): eager against transformers' forward and the kernels'
   reference math; a cell whose eager is wrong fails whatever graph = eager says (with_reference).
7. **Parallel**: a parallel cell's eager against the same weights unsharded (harness/cell/parallel.py's tp1_check,
   run by harness/cell/run.py).

The numbers are the layers' places in the judge, not the order run_cell runs them in: 7 and 6 run right after 1,
before capture, while the GPU holds only the model and eager's cache; 3 runs before 4, which reads its noise.

The policy reads what it needs of a cell through `Cell` (harness/cell/run.py's _Cell is one) and never imports the
cell runner.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Protocol

from harness.cell.crash import Stop
from harness.cell.judge.lockstep import LockstepStats, first_diverging_piece, lockstep_stats, nan_max
from harness.cell.judge.padding import (FP32_PADDING_RTOL, PROBE_RTOL, attention_padding_rel, float32_attention,
                                        float32_padding_rel, padding_leak, probe_note)
from harness.cell.judge.reference import reference_layer
from harness.cell.judge.tokens import Judgement, compare
from harness.cell.judge.tolerances import (KL_TOL, SAME_PADDING_RTOL_EAGER, logprob_bound, same_padding_rtol,
                                           tie_margin)
from harness.cell.prompts import Case, repeat_of
from harness.metrics import CellMetrics, EagerSelfDiff
from harness.outcome import Status
from pcg_core.config import EngineConfig
from pcg_core.engine import Engine, SequenceOutput

if TYPE_CHECKING:
    from harness.cell.coverage import CoverageCounter
    from harness.cell.spec import CellSpec
    from pcg_core.model import LoadedModel

Outputs = dict[str, list[SequenceOutput]]


class Cell(Protocol):
    """What the judge reads of a cell, and writes into its metrics."""

    spec: CellSpec  # dtype, quant, kv_cache and compiler decide which noise is measured and which bound holds
    metrics: CellMetrics  # the judge's numbers go here
    lm: LoadedModel | None  # its model: the float32 padding check and the reference layer run on it
    cases: list[Case] | None  # the prompt suite
    coverage: CoverageCounter | None  # what the graph's run of the suite covered (recorded beside the verdict)

    @property
    def loaded(self) -> LoadedModel:
        """`lm`, once the cell has loaded it."""

    @property
    def suite(self) -> list[Case]:
        """`cases`, once the cell has built them."""

    @property
    def tol(self) -> float:
        """The logprob tolerance: the spec's, or the dtype's (tolerances.LOGPROB_TOL)."""


def eager_self_check(cell: Cell, ref: Outputs, ref2: Outputs) -> None:
    """Layer 1: eager twice. Eager's own noise floor: if eager-vs-eager passes the judge the graph faces, the graph
    can be judged; if not, the cell cannot tell graph bugs from eager noise (on a GPU, bf16 decode near-ties have
    been seen to flip between runs). Raises Stop(eager_nondeterministic) then."""
    cell.metrics.judge.eager_bitwise_deterministic = list(ref.values()) == list(ref2.values())
    if not cell.metrics.judge.eager_bitwise_deterministic:
        self_check = compare(ref, ref2, cell.tol)
        cell.metrics.judge.eager_self_diff = EagerSelfDiff(
            token_match=self_check.token_match, max_prompt_logprob_diff=self_check.max_prompt_logprob_diff,
            max_output_logprob_diff=self_check.max_output_logprob_diff)
        if self_check.status != Status.PASS:
            raise Stop(Status.EAGER_NONDETERMINISTIC,
                        f"two eager runs of the same prompts differ beyond the judge's bounds: {self_check.reason}")


def reference_check(cell: Cell, config: EngineConfig, ref: Outputs) -> None:
    """Layer 6 (reference.py): eager's outputs `ref` (run with `config`, KV capacity included) against
    transformers' forward and the kernels' reference math, into metrics.judge.reference."""
    cell.metrics.judge.reference = reference_layer(cell.loaded.model, config, cell.suite, ref, cell.spec.quant != "none")


def with_reference(m: CellMetrics, status: Status, reason: str) -> tuple[Status, str]:
    """The graph judge's verdict with the reference layer's (6) beside it: a cell whose eager is wrong fails,
    whatever graph = eager says; one the layer could not measure keeps its verdict, saying so."""
    check = m.judge.reference
    if check is None or check.status == "pass":
        return status, reason
    line = f"reference layer: {check.summary()}"
    joined = (f"{reason}; {line}" if reason else line)[:2000]
    if check.status == "fail" and status in (Status.PASS, Status.PASS_FLAKY):
        return Status.FAIL_ACCURACY, joined
    return status, joined


def judge(cell: Cell, eager: Engine, graph: Engine, ref: Outputs, cand: Outputs) -> Judgement:
    """Layers 3-5: the lockstep first (KL at prompt and decode positions, the same-padding difference and, in half
    precision, the eager path's own noise), then tokens (a flip excused only within the noise) and logprobs against
    unpadded eager; on failure, the first diverging piece in the worst case."""
    m = cell.metrics
    # In float32 the eager path's own noise (run twice, padded vs unpadded) is ~1e-6, three orders under every
    # bound: measured only in half precision, where it is near them — and under quantization, which turns a 1e-7
    # change of a GEMM's summation order into a whole FP8/INT8 rounding step of the next layer's activation.
    noise = cell.spec.dtype != "float32" or cell.spec.quant != "none" or cell.spec.kv_cache != "auto"
    stats = {c.name: lockstep_stats(eager, graph, c, noise=noise) for c in cell.suite}
    m.judge.padding_noise = nan_max(st.padding_noise for st in stats.values())
    noisy = [c for c in cell.suite if stats[c.name].padding_noise > cell.tol]
    exact = _padding_exact(cell, graph, noisy)
    bound = logprob_bound(cell.tol, m.judge.padding_noise if exact is not False else 0.0)
    eager_noise = m.judge.eager_self_diff.max_output_logprob_diff if m.judge.eager_self_diff else None
    m.judge.tie_margin = tie_margin(bound, eager_noise)
    judgement = compare(ref, cand, bound, m.judge.tie_margin)
    for name, value in asdict(judgement).items():
        if name not in ("status", "reason", "failed_cases"):
            setattr(m.judge, name, value)
    repeats = [(c.name, r) for c in cell.suite if (r := repeat_of(c))]
    assert cell.coverage is not None  # counted over the graph's run of the suite (run.py's _candidate)
    m.coverage = cell.coverage.result(all(cand[n] == cand[r] for n, r in repeats) if repeats else None)
    pad_rtol = same_padding_rtol(cell.spec.resolved_dtype, cell.spec.compiler,
                                 nan_max(st.eager_same_padding_rel for st in stats.values()))
    lockstep_failed = _lockstep_layers(cell, stats, judgement, pad_rtol)
    failed = set(judgement.failed_cases) | lockstep_failed
    if judgement.status == Status.FAIL_ACCURACY and exact is not False and not lockstep_failed:
        exact = _excuse_padding(cell, graph, judgement, stats, {c.name for c in noisy} if exact else set())
    if judgement.status == Status.FAIL_ACCURACY and exact is False:
        judgement.reason += f"; eager's padding is not exact: {padding_leak(cell.metrics)}, so its noise is not allowed for"
    if judgement.status == Status.FAIL_ACCURACY:
        _diagnose(cell, eager, graph, judgement, stats, failed, pad_rtol)
    return judgement


def _padding_exact(cell: Cell, graph: Engine, cases: list[Case]) -> bool | None:
    """Is eager's padding exact in float32 (padding.py) for `cases`? True, False (a leak), or None when not asked
    (no case; an unquantized float32 cell, whose eager noise is already float32's) or when the check could not run
    (why in padding_check_error). A quantized cell is checked in any dtype (on its float twin): its quantizers make
    float32 noisy too. The worst difference measured is kept in padding_rel_fp32. A backend that ran that check on
    sdpa (no float32 kernel, or one compiled per shape: padding.float32_attention) has its own padding probed too
    (padding_probe_rel, in the cell's dtype); the seconds both took in padding_check_s."""
    quantized = cell.spec.quant != "none" or cell.spec.kv_cache != "auto"
    if not cases or (not quantized and cell.spec.dtype == "float32"):
        return None
    m = cell.metrics
    t0 = time.perf_counter()
    try:
        rel = float32_padding_rel(cell.loaded.model, graph.config, graph.bucket_for, cases)
        probe = None
        if float32_attention(graph.config.attention, graph.config.device) != graph.config.attention:
            probe = attention_padding_rel(cell.loaded.model, graph.config, graph.bucket_for, cases)
    except Exception as e:  # noqa: BLE001 - out of memory, a backend without float32: nothing is allowed for
        m.judge.padding_check_error = f"{type(e).__name__}: {e}"[:1000]
        return None
    finally:
        m.judge.padding_check_s = round((m.judge.padding_check_s or 0.0) + time.perf_counter() - t0, 3)
    m.judge.padding_rel_fp32 = rel if m.judge.padding_rel_fp32 is None else nan_max([m.judge.padding_rel_fp32, rel])
    if probe is not None:
        m.judge.padding_probe_rel = probe if m.judge.padding_probe_rel is None else nan_max([m.judge.padding_probe_rel, probe])
    return rel <= FP32_PADDING_RTOL and (probe is None or probe <= PROBE_RTOL)  # NaN: False


def _excuse_padding(cell: Cell, graph: Engine, judgement: Judgement, stats: dict[str, LockstepStats],
                    proven: set[str]) -> bool | None:
    """A failure against unpadded eager where the graph matches eager at its own padding at every forward of every
    case within the eager-kernel bound, in cases whose padding float32 shows exact (those not in `proven` are
    checked now): what fails is eager's own half-precision rounding at the padded shapes (a near-tie router or
    token turned), not the graph. Such a cell passes, the reason saying so; a compiler's looser same-padding bound
    is not enough. Returns whether the failing cases' padding is exact (as _padding_exact)."""
    same = nan_max(st.same_padding_rel for st in stats.values())
    if not same <= SAME_PADDING_RTOL_EAGER or not judgement.failed_cases:
        return None
    rest = [c for c in cell.suite if c.name in set(judgement.failed_cases) - proven]
    exact = _padding_exact(cell, graph, rest) if rest else True
    m = cell.metrics
    if exact is None and m.judge.padding_check_error:
        _unchecked(judgement, m.judge.padding_check_error)
    if not exact:
        return exact
    quantized = cell.spec.quant != "none"
    judgement.status = Status.PASS
    judgement.reason = (f"padding, not the graph: {judgement.reason}; the graph equals eager at its padding at every "
                        f"forward ({same:.3g} ≤ {SAME_PADDING_RTOL_EAGER:g}) and in float32 eager "
                        f"{'(the float twin: weights dequantized, no activation quantizer) ' if quantized else ''}"
                        f"padded as the graph pads matches unpadded ({m.judge.padding_rel_fp32:.3g} per row ≤ "
                        f"{FP32_PADDING_RTOL:g}{probe_note(m)}): "
                        f"{'rounding steps of the quantizers' if quantized else 'half-precision rounding'}"
                        f" at the padded shapes (padding noise {m.judge.padding_noise:.3g})")[:2000]
    return exact


def _unchecked(judgement: Judgement, error: str) -> None:
    """The one excuse left to a failure, and the float32 check that decides it could not run: said in the reason.
    Out of memory (a full card, cells side by side) ends the cell in OOM, so it is run again (alone) rather than
    recorded as a graph fault nobody has shown."""
    judgement.reason = (f"{judgement.reason}; the graph equals eager at its padding, and the float32 check that "
                        f"would tell padding from the graph could not run ({error[:300]})")[:2000]
    if "out of memory" in error.lower() or "OutOfMemoryError" in error:
        judgement.status = Status.OOM


def _lockstep_layers(cell: Cell, stats: dict[str, LockstepStats], judgement: Judgement, bound: float) -> set[str]:
    """Layer 3's verdict: KL and the same-padding check (against `bound`) over every case; adds their failures to
    the judgement, returns those cases."""
    m, dtype = cell.metrics, cell.spec.resolved_dtype
    m.judge.max_prompt_kl = nan_max(st.prompt_kl for st in stats.values())
    m.judge.max_decode_kl = nan_max(st.decode_kl for st in stats.values())
    m.judge.max_same_padding_diff = nan_max(st.same_padding_rel for st in stats.values())
    over_kl = [n for n, st in stats.items() if not max(st.prompt_kl, st.decode_kl) <= KL_TOL[dtype]
               or math.isnan(st.prompt_kl) or math.isnan(st.decode_kl)]
    over_pad = [n for n, st in stats.items() if not st.same_padding_rel <= bound]  # NaN fails too
    problems = []
    if over_kl:
        problems.append(f"KL {nan_max([m.judge.max_prompt_kl, m.judge.max_decode_kl]):.3g} > {KL_TOL[dtype]:g} (prompt "
                        f"{m.judge.max_prompt_kl:.3g}, decode {m.judge.max_decode_kl:.3g}; first in {over_kl[0]})")
    if over_pad:
        worst = max(over_pad, key=lambda n: (math.isnan(stats[n].same_padding_rel), stats[n].same_padding_rel))
        problems.append(f"graph vs eager at the same padding differs by {stats[worst].same_padding_rel:.3g} > {bound:g} "
                        f"({worst}, {stats[worst].where})")
    if problems:
        extra = "; ".join(problems)
        judgement.reason = f"{judgement.reason}; {extra}" if judgement.status != Status.PASS else extra
        judgement.status = Status.FAIL_ACCURACY
    return {*over_kl, *over_pad}


def _diagnose(cell: Cell, eager: Engine, graph: Engine, judgement: Judgement, stats: dict[str, LockstepStats],
              failed: set[str], rtol: float) -> None:
    """Layer 5 on the failing case where graph and eager differ most at the same padding (where a fault shows,
    rather than a flip noise allowed elsewhere); its own failure is recorded beside the verdict, never over it."""
    m = cell.metrics
    cases = [c for c in cell.suite if c.name in failed] or cell.suite
    worst = max(cases, key=lambda c: (math.isnan(stats[c.name].same_padding_rel), stats[c.name].same_padding_rel,
                                      nan_max([stats[c.name].prompt_kl, stats[c.name].decode_kl])))
    try:
        found = first_diverging_piece(eager, graph, worst, rtol)
        m.judge.diverging_piece = found.piece
        judgement.reason += f"; {found}"
    except Exception as e:  # noqa: BLE001 - the diagnosis only explains; its failure must not cost the verdict
        m.judge.diagnosis_error = f"{type(e).__name__}: {e}"[:1000]
        judgement.reason += f"; the first-diverging-piece diagnosis failed ({m.judge.diagnosis_error[:200]})"
