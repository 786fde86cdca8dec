"""A cell's outcome: the one value that flows from the cell through the worker, the store and the reports to the
dashboard, and the words it is made of (statuses, axes, the model reference).

Everything downstream of the cell reads these types instead of guessing at dict keys, and this module imports
nothing from the runtime, so the store, the reports and the dashboard never pull in torch to know what "pass"
means.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from pcg_core.quant.schemes import registry as quant_registry


class Status(StrEnum):
    """What happened to a cell. Only `pass` and `pass_flaky` pass; see NOT_COUNTED for the pass rate."""

    PASS = "pass"
    PASS_FLAKY = "pass_flaky"  # failed, then passed on the retry
    FAIL_ACCURACY = "fail_accuracy"
    FAIL_CAPTURE = "fail_capture"
    FAIL_RUN = "fail_run"
    TIMEOUT = "timeout"
    OOM = "oom"
    EAGER_FAIL = "eager_fail"  # the reference itself failed: nothing to judge the graph against
    EAGER_NONDETERMINISTIC = "eager_nondeterministic"  # eager vs eager beyond the judge's bounds
    UNSUPPORTED = "unsupported"  # decided before launch, with the reason
    SKIPPED = "skipped"


STATUSES: tuple[str, ...] = tuple(s.value for s in Status)
PASSING: tuple[str, ...] = (Status.PASS, Status.PASS_FLAKY)
# Shown, but not counted against the pass rate: the graph path was never judged.
NOT_COUNTED: tuple[str, ...] = (Status.EAGER_FAIL, Status.UNSUPPORTED, Status.SKIPPED)
# A retry cannot change these: they passed, were never run, or fail the same way whatever the graph does.
NOT_RETRIED: tuple[str, ...] = (*PASSING, Status.UNSUPPORTED, Status.SKIPPED, Status.EAGER_FAIL, Status.EAGER_NONDETERMINISTIC)

# A cell is one point of these axes.
AXES = ("model", "quant", "attention", "parallel", "graph", "compiler", "kv_cache")
# Axes added after runs were stored, with the value every cell had before: a record without the axis holds it, and
# a cell at that value keeps the key it had before the axis existed (so stored runs still read and compare).
AXIS_DEFAULTS: dict[str, str] = {"kv_cache": "auto"}

_VARIANT = re.compile(r"^(full|tiny|trim:([1-9][0-9]*))$")
VARIANT_GRAMMAR = "full, tiny or trim:N (N ≥ 1)"


@dataclass(frozen=True)
class ModelRef:
    """The `model` axis value `card:variant`: a model card and the size it runs at.

    full: the real model (real weights); tiny: CPU-sized widths, synthetic weights; trim:N: the first N decoder
    layers at real widths, synthetic weights.
    """

    card: str
    variant: str
    layers: int | None = None  # trim:N

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        card, _, variant = str(text).partition(":")
        m = _VARIANT.match(variant)
        if not card or m is None:
            raise ValueError(f"model {text!r}: write it as CARD:VARIANT with VARIANT one of {VARIANT_GRAMMAR}")
        return cls(card, variant, int(m.group(2)) if m.group(2) else None)

    def __str__(self) -> str:
        return f"{self.card}:{self.variant}"

    @property
    def tiny(self) -> bool:
        return self.variant == "tiny"

    @property
    def weights(self) -> str:
        """`real` for the full model, `synthetic` for the shrunk variants."""
        return "real" if self.variant == "full" else "synthetic"


def cell_key(axes: dict[str, str]) -> str:
    """The stable key of the cell at these axes: an axis of AXIS_DEFAULTS at its default (or absent) is left out,
    so a cell's key is the one it had before that axis existed."""
    return "|".join(f"{a}={axes[a]}" for a in AXES
                    if a not in AXIS_DEFAULTS or axes.get(a, AXIS_DEFAULTS[a]) != AXIS_DEFAULTS[a])


def with_default_axes(axes: Mapping[str, str]) -> dict[str, str]:
    """`axes` with every AXIS_DEFAULTS axis it lacks at its default (a record stored before the axis existed)."""
    return {**AXIS_DEFAULTS, **axes} if isinstance(axes, Mapping) else axes


def canonical_key(key: str) -> str:
    """`key` with the quant axis in today's spelling (fp4, NVFP4's name before the scheme registry, is nvfp4): what
    cells of different runs are matched by, while each record keeps, and reports show, the key it was stored under."""
    parts = key.split("|")
    return "|".join(f"quant={quant_registry.canonical(p[6:])}" if p.startswith("quant=") else p for p in parts)


def key_spellings(key: str) -> list[str]:
    """`key` and every spelling a store may hold it under (the quant axis by an alias): for lookups by key."""
    out = [key]
    for alias, name in quant_registry.ALIASES.items():
        if f"|quant={name}|" in f"|{key}|":
            out.append(f"|{key}|".replace(f"|quant={name}|", f"|quant={alias}|")[1:-1])
    return out


MAX_ATTEMPT = 100  # a cell runs once and is retried once; anything near this is not an attempt number
LOG_KEEP = 200_000  # characters of a cell's log a record keeps: the end, where the error is


def _encodable(text: str) -> str:
    """The text, if UTF-8 can hold it (a lone surrogate cannot, and no database stores one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{text[:40]!r} is not valid text (a lone surrogate at {e.start})") from None
    return text


class _Model(BaseModel):
    # Rows written by older versions carry keys nothing reads any more: they are ignored, not an error.
    model_config = ConfigDict(extra="ignore")


class Latency(_Model):
    """Median prefill latency (ms) at one token count, eager and graph side by side in one process."""

    eager: float | None = None
    graph: float | None = None


class EagerSelfDiff(_Model):
    """How far two eager runs of the same prompts were apart (recorded only when not bitwise equal)."""

    token_match: float | None = None
    max_prompt_logprob_diff: float | None = None
    max_output_logprob_diff: float | None = None


class ReferenceCheck(_Model):
    """The judge's reference layer (layer 6, harness/cell/judge/reference.py): is *eager* right? graph = eager says
    nothing about a kernel or an attention backend both share. `status`: pass, fail, or not_measured (with why in
    `reason`)."""

    status: Literal["pass", "fail", "not_measured"] = "not_measured"
    reason: str = ""
    # pcg's eager prompt and output logprobs against transformers' own forward of the same weights (its attention
    # implementation, one sequence at a time, unpadded; quantized layers as their reference math), in float32:
    # |Δ| mean and max over positions, and the same for transformers' forward in the cell's dtype (its own noise),
    # which sets the bounds.
    attention: str | None = None  # transformers' attention implementation it ran (sdpa, eager)
    # The cell's KV cache: fp8_e4m3 cells are held to transformers' forward with K and V rounded as the cache holds
    # them, with the same scales (harness/cell/judge/kv_reference.py). None: a row from before the axis.
    kv_cache: str | None = None
    subject: str = "the model"  # or "the float twin": float32 cells whose activation quantizers make it chaotic
    positions: int | None = None
    mean_logprob_diff: float | None = None
    max_logprob_diff: float | None = None
    mean_noise: float | None = None
    max_noise: float | None = None
    mean_bound: float | None = None
    max_bound: float | None = None
    positions_over_max: int | None = None  # past max_bound (a few allowed where activations are quantized)
    token_flips: int | None = None  # output tokens that are not the reference's argmax beyond a near-tie
    # float32 with an FP8 KV cache: each position is judged past NOISE_MULT × what a chance FP8 turn moves it by (the
    # chance twins, kv_reference.py): the positions past max_bound only by that much, and the mean so judged. None:
    # no chance twins ran.
    chance_turns: int | None = None
    chance_adjusted_mean: float | None = None
    # Quantized cells: the kernels against their reference math (same activation quantization, dequantized
    # weights, float32 accumulation) on one prompt through pcg's eager engine, hidden states per layer (each
    # attention's input, then the last): the first layer whose relative error is over its bound (where a fault
    # enters; else the layer closest to its bound), that bound, and the reference's own half-precision noise there.
    kernel_rel: float | None = None
    kernel_bound: float | None = None
    kernel_layer: str | None = None
    kernel_noise: float | None = None
    # What the scheme itself costs (reported, never judged): the reference math against the float twin (dequantized
    # weights, no activation quantizer), relative error of the last hidden states.
    scheme_rel: float | None = None

    def summary(self) -> str:
        """One line for `pcgh cell`, the report and the cell page."""
        if self.status == "not_measured":
            return f"not measured: {self.reason}"
        parts = []
        if self.mean_logprob_diff is not None:
            kv = ", K/V rounded to FP8" if self.kv_cache not in (None, "auto") else ""
            parts.append(f"{self.subject} vs transformers ({self.attention}{kv}, float32) over {self.positions} positions: "
                         f"|Δlogprob| mean "
                         f"{self.mean_logprob_diff:.3g} (bound {self.mean_bound:.3g}), max {self.max_logprob_diff:.3g} (bound "
                         f"{self.max_bound:.3g}, {self.positions_over_max} positions past it"
                         f"{f', {self.chance_turns} more within a chance FP8 turn' if self.chance_turns else ''}"
                         f"{f', mean beyond chance turns {self.chance_adjusted_mean:.3g}' if self.chance_adjusted_mean is not None else ''}), "
                         f"{self.token_flips} token flips")
        if self.kernel_rel is not None:
            parts.append(f"kernels vs reference math: {self.kernel_rel:.3g} (bound {self.kernel_bound:.3g}) at "
                         f"{self.kernel_layer}")
        if self.scheme_rel is not None:
            parts.append(f"scheme cost {self.scheme_rel:.3g}")
        head = "pass" if self.status == "pass" else f"FAIL: {self.reason}"
        return f"{head} — " + "; ".join(parts) if parts else head


class CheckpointKvScales(_Model):
    """A checkpoint that declares an FP8 KV cache: its per-layer k/v scales as the loader read and checked them
    (pcg_core/quant/formats/kv_scales.py), and whether the run applied them (False: the KV cache ran in the model dtype,
    where they are unused)."""

    layers: int = 0
    k_min: float | None = None
    k_max: float | None = None
    v_min: float | None = None
    v_max: float | None = None
    applied: bool = False

    def summary(self) -> str:
        """One line for `pcgh cell` and the cell's reason."""
        ranges = (f" (k {self.k_min:.3g}–{self.k_max:.3g}, v {self.v_min:.3g}–{self.v_max:.3g})"
                  if None not in (self.k_min, self.k_max, self.v_min, self.v_max) else "")
        use = "applied" if self.applied else "not applied: the KV cache ran in the model dtype"
        return (f"the checkpoint declares an FP8 KV cache; the k/v scales of its {self.layers} attention layers were "
                f"read and checked{ranges}, {use}")


class SuiteCoverage(_Model):
    """What the prompt suite made the graph candidate run (harness/cell/coverage.py counts it): printed per cell,
    stored with it, shown on its page, so a judge that passed also says what it looked at."""

    buckets: int = 0  # in the ladder
    buckets_hit: int = 0  # replayed at least once
    largest_bucket_hit: bool = False
    regions: int = 0  # ladder regions (runs of one step size)
    regions_hit: int = 0
    layouts: dict[int, int] = Field(default_factory=dict)  # bucket → distinct packed layouts replayed there
    decode_steps: int = 0  # decode forwards on the graph path
    decode_layouts: int = 0  # distinct decode batch memberships
    beyond_ladder_forwards: int = 0  # graph forwards with a position past the largest bucket
    eager_forwards: int = 0  # forwards above the largest bucket, run eagerly
    repeat_identical: bool | None = None  # the final repeat replayed bitwise like its first run (None: not run)

    @property
    def max_layouts(self) -> int:
        return max(self.layouts.values(), default=0)

    def summary(self) -> str:
        """One line: what a reader checks first."""
        rep = {True: "bitwise", False: "DIFFERS", None: "not run"}[self.repeat_identical]
        return (f"{self.buckets_hit}/{self.buckets} buckets (largest {'yes' if self.largest_bucket_hit else 'NO'}), "
                f"{self.regions_hit}/{self.regions} ladder regions, up to {self.max_layouts} layouts per bucket, "
                f"{self.decode_steps} decode steps ({self.decode_layouts} memberships), "
                f"{self.beyond_ladder_forwards} forwards past the largest bucket's positions, repeat {rep}")


class CellMetrics(_Model):
    """What a cell measured. A field is None when the cell ended before measuring it (a crash, an unsupported
    model), so "not measured" never reads as zero."""

    # The run settings, enough to rerun the cell (harness.repro); the axes hold the rest. None: not recorded
    # (a cell that died before reporting, or one stored before the field existed).
    device: str | None = None
    dtype: str | None = None
    layers: int | None = None
    tiny: bool | None = None
    weights: str | None = None
    max_tokens: int | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    top_k: int | None = None
    logprob_tol: float | None = None  # None here and in the spec alike: the judge's per-dtype default
    memory_share: float | None = None  # the graph pool's share of the KV cache's room past which a memory line shows
    peaked: bool | None = None  # synthetic weights get a peaked output head (loader.peak_logits); None: older row
    kv_cache: str | None = None  # the KV-cache dtype (also an axis); None: a row from before the axis
    kv_scales: str | None = None  # an FP8 KV cache's scales: "checkpoint" (declared) or "calibrated"
    repeats: int | None = None  # fresh processes the cell ran in (--repeats); None: one
    # Quantization (cells with a scheme): linears quantized, and max |Δ prompt logprob| of quantized eager vs the
    # float model on the first case — what the scheme costs, recorded, never judged.
    quant_layers: int | None = None
    quant_logprob_diff: float | None = None
    # A tensor-parallel cell: max |Δ prompt logprob| of its eager vs the same full weights eager in one process
    # (TP=1), on the first case; judged against the logprob tolerance. None: a single-process cell (or real weights).
    tp1_logprob_diff: float | None = None
    # A checkpoint declaring an FP8 KV cache: its scales as read and checked. None: none declared (or an older row).
    checkpoint_kv_scales: CheckpointKvScales | None = None
    # Capture.
    pieces: int | None = None
    graphs_captured: int | None = None
    trace_s: float | None = None
    capture_s: float | None = None
    compile_s: float | None = None
    graph_pool_bytes: int | None = None
    kv_bytes_per_token: int | None = None  # KV cache memory per token over all layers (MLA: the latent's)
    # Per GPU (rank), harness/cell/memory.py: the weights, the budget a serving engine plans with (90% of the GPU;
    # None off CUDA) and the largest context whose KV fits beside the weights with the graph pool and without it.
    weights_bytes: int | None = None
    memory_budget_bytes: int | None = None
    max_context_tokens: int | None = None
    max_context_tokens_without_graphs: int | None = None
    eager_fallbacks: int | None = None
    bucket_hits: dict[int, int] = Field(default_factory=dict)
    # Judge.
    eager_bitwise_deterministic: bool | None = None
    eager_self_diff: EagerSelfDiff | None = None
    token_match: float | None = None
    max_prompt_logprob_diff: float | None = None
    max_output_logprob_diff: float | None = None
    max_prompt_kl: float | None = None
    max_decode_kl: float | None = None  # at decode positions, eager's tokens fed to both sides
    max_same_padding_diff: float | None = None  # ‖graph − eager at the graph's padding‖ / ‖eager‖, worst forward
    padding_noise: float | None = None  # max |Δlogprob| eager padded vs unpadded (half precision; 0: not measured)
    # Where padding noise widened the bound (harness/cell/judge/padding.py): the same forwards in float32 (the float
    # twin), padded vs unpadded, worst per-row relative difference — exact padding (≤ 1e-4) or a leak; None: not
    # checked.
    padding_rel_fp32: float | None = None
    padding_check_error: str | None = None  # the float32 check could not run (e.g. out of memory): why
    # A backend with no float32 kernel (float32 then ran on sdpa): its own padding probe in the cell's dtype, worst
    # per-row relative change of real rows' attention output when only padding rows' inputs change (0: exact).
    padding_probe_rel: float | None = None
    topk_containment_ok: bool | None = None
    divergences: list[str] = Field(default_factory=list)
    worst_sequence: str | None = None  # the sequence farthest from its own eager reference: case[i] (its Δ logprob)
    # The judge's layer 5 (harness/cell/judge/policy.py numbers the layers): the first diverging piece.
    diverging_piece: str | None = None  # layer 5: the first piece whose output differs, when the judge failed
    diagnosis_error: str | None = None  # layer 5 itself failed: why (the verdict above stands)
    tie_margin: float | None = None  # the largest eager top-2 margin a token flip is excused within (the noise)
    coverage: SuiteCoverage | None = None
    reference: ReferenceCheck | None = None  # the reference layer: is eager right? None: a row from before it
    repeat_statuses: list[str] = Field(default_factory=list)  # with --repeats: each fresh process's status
    # The GPUs a CUDA cell holds (its ranks: pcg_core.known.world_size), or, refused, would need; None: a CPU cell or
    # a row from before. rank_statuses: each rank's status, for a cell of several (harness/launcher/ranks.py: the
    # cell's outcome is rank 0's).
    gpus: int | None = None
    rank_statuses: list[str] = Field(default_factory=list)
    # How the routed experts spread over ranks reach the tokens (harness/cell/parallel.py: all_to_all, all_gather,
    # all_reduce); None: no experts spread (or a row from before).
    expert_dispatch: str | None = None
    # Latency, per prompt token count.
    latency_ms: dict[int, Latency] = Field(default_factory=dict)
    speedup: dict[int, float | None] = Field(default_factory=dict)
    # run_cell's own time, load to latency: the record's duration_s adds the worker process around it.
    cell_s: float | None = Field(default=None, validation_alias=AliasChoices("cell_s", "duration_s"))
    # Seconds in each phase run_cell reports (load, eager, capture, run, latency): where a cell's time goes.
    phase_s: dict[str, float] = Field(default_factory=dict)

    def graph_latencies(self) -> dict[int, float]:
        """Graph latency (ms) per token count, the measured ones only."""
        return {n: v.graph for n, v in self.latency_ms.items() if v.graph is not None}

    @classmethod
    def lenient(cls, data: Any) -> CellMetrics:
        """Stored metrics, whatever their shape: a value that does not read as its field's type is dropped, so
        one odd value (an upload from before the type existed could hold any JSON) never loses the row."""
        data = dict(data) if isinstance(data, Mapping) else {}
        while True:
            try:
                return cls.model_validate(data)
            except ValidationError as e:
                bad = {err["loc"][0] for err in e.errors() if err["loc"]} & data.keys()
                if not bad:
                    return cls()
                for name in bad:
                    del data[name]


SCALAR_METRICS = ("token_match", "max_prompt_logprob_diff", "max_output_logprob_diff", "max_prompt_kl", "max_decode_kl",
                  "max_same_padding_diff", "capture_s", "compile_s", "trace_s", "graph_pool_bytes", "pieces",
                  "graphs_captured", "eager_fallbacks", "kv_bytes_per_token")


class CellOutcome(_Model):
    """A cell's status, why, what it measured and how long it took: what `run_cell` returns."""

    status: Status
    reason: str = ""
    metrics: CellMetrics = Field(default_factory=CellMetrics)
    duration_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def to_json(self) -> str:
        """JSON text; NaN stays NaN (Python's json reads it back), so a measured NaN is not lost on the way."""
        return json.dumps(self.model_dump(mode="python"))

    @classmethod
    def from_json(cls, text: str) -> CellOutcome:
        return cls.model_validate(json.loads(text))


class CellRecord(CellOutcome):
    """One attempt at one cell of one run, as the store keeps it: the outcome plus its key, axes, attempt and log."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=2000)
    axes: dict[str, str]
    attempt: int = Field(default=1, ge=1, le=MAX_ATTEMPT)
    log: str = ""

    @field_validator("axes", mode="before")
    @classmethod
    def _axes_added_later(cls, axes: Any) -> Any:
        return with_default_axes(axes)

    @field_validator("axes")
    @classmethod
    def _all_axes(cls, axes: dict[str, str]) -> dict[str, str]:
        if set(axes) != set(AXES):
            raise ValueError(f"axes must have exactly {', '.join(AXES)}, got {', '.join(axes) or 'none'}")
        for value in axes.values():
            _encodable(value)
        return axes

    @field_validator("key")
    @classmethod
    def _key_text(cls, key: str) -> str:
        return _encodable(key)

    @field_validator("log")
    @classmethod
    def _log_tail(cls, log: str) -> str:
        return log[-LOG_KEEP:]

    @classmethod
    def of(cls, key: str, axes: dict[str, str], outcome: CellOutcome, *, attempt: int = 1, log: str = "") -> CellRecord:
        return cls(key=key, axes=axes, attempt=attempt, log=log, **dict(outcome))

    @property
    def model(self) -> ModelRef:
        return ModelRef.parse(self.axes["model"])

    @classmethod
    def read(cls, row: Mapping[str, Any]) -> CellRecord:
        """A record as a store holds it: strict about everything but the metrics, read leniently
        (CellMetrics.lenient), since a writer may have stored them before they had a type."""
        try:
            return cls.model_validate(row)
        except ValidationError:
            return cls.model_validate({**row, "metrics": CellMetrics.lenient(row.get("metrics"))})
