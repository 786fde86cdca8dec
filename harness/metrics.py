"""What a cell measured (CellMetrics), grouped by who measures it, and the measurement types inside it.

Stored rows and uploads from before the groups are flat (every metric at the top level); they read the same (a
before-validator moves each flat key into its group), so no row is rewritten. This module imports nothing from
the runtime, like harness.outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator


class StoredModel(BaseModel):
    # Rows written by older versions carry keys nothing reads any more: they are ignored, not an error.
    model_config = ConfigDict(extra="ignore")


class Latency(StoredModel):
    """Median prefill latency (ms) at one token count, eager and graph side by side in one process."""

    eager: float | None = None
    graph: float | None = None


class EagerSelfDiff(StoredModel):
    """How far two eager runs of the same prompts were apart (recorded only when not bitwise equal)."""

    token_match: float | None = None
    max_prompt_logprob_diff: float | None = None
    max_output_logprob_diff: float | None = None


class ReferenceCheck(StoredModel):
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


class CheckpointKvScales(StoredModel):
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


class SuiteCoverage(StoredModel):
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


class CellSettings(StoredModel):
    """How the cell ran, enough to rerun it (harness.repro); the axes hold the rest. None: not recorded (a cell that
    died before reporting, or one stored before the field existed)."""

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
    # How the routed experts spread over ranks reach the tokens (harness/cell/parallel.py: all_to_all, all_gather,
    # all_reduce); None: no experts spread (or a row from before).
    expert_dispatch: str | None = None


class QuantMetrics(StoredModel):
    """What quantization did (cells with a scheme, or an FP8 KV cache): linears quantized, max |Δ prompt logprob| of
    quantized eager vs the float model on the first case — what the scheme costs, recorded, never judged — and the
    KV cache's scales."""

    quant_layers: int | None = None
    quant_logprob_diff: float | None = None
    kv_scales: str | None = None  # an FP8 KV cache's scales: "checkpoint" (declared) or "calibrated"
    # A checkpoint declaring an FP8 KV cache: its scales as read and checked. None: none declared (or an older row).
    checkpoint_kv_scales: CheckpointKvScales | None = None


class CaptureMetrics(StoredModel):
    """What the capture backend built and how long it took, and which buckets the run replayed."""

    pieces: int | None = None
    graphs_captured: int | None = None
    trace_s: float | None = None
    capture_s: float | None = None
    compile_s: float | None = None
    graph_pool_bytes: int | None = None
    eager_fallbacks: int | None = None
    bucket_hits: dict[int, int] = Field(default_factory=dict)
    # The candidate's attention kernels compiled for it (flex: one per token count and modifier set), those first
    # met in the run phase (after capture), and the host seconds building them all: where a cold cell's time goes.
    attention_kernels: int | None = None
    attention_kernels_in_run: int | None = None
    attention_build_s: float | None = None


class MemoryMetrics(StoredModel):
    """Per GPU (rank), harness/cell/memory.py: the weights, the budget a serving engine plans with (90% of the GPU;
    None off CUDA) and the largest context whose KV fits beside the weights with the graph pool and without it."""

    kv_bytes_per_token: int | None = None  # KV cache memory per token over all layers (MLA: the latent's)
    weights_bytes: int | None = None
    memory_budget_bytes: int | None = None
    max_context_tokens: int | None = None
    max_context_tokens_without_graphs: int | None = None


class JudgeMetrics(StoredModel):
    """What the judge measured (harness/cell/judge/policy.py numbers its layers)."""

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
    # A backend whose float32 check ran on sdpa (padding.float32_attention): its own padding probe in the cell's dtype,
    # worst per-row relative change of real rows' attention output when only padding rows' inputs change (0: exact).
    padding_probe_rel: float | None = None
    padding_check_s: float | None = None  # seconds those checks took (part of the judge phase; None: not run)
    topk_containment_ok: bool | None = None
    divergences: list[str] = Field(default_factory=list)
    worst_sequence: str | None = None  # the sequence farthest from its own eager reference: case[i] (its Δ logprob)
    diverging_piece: str | None = None  # layer 5: the first piece whose output differs, when the judge failed
    diagnosis_error: str | None = None  # layer 5 itself failed: why (the verdict above stands)
    tie_margin: float | None = None  # the largest eager top-2 margin a token flip is excused within (the noise)
    reference: ReferenceCheck | None = None  # the reference layer: is eager right? None: a row from before it
    # A parallel cell: max |Δ prompt logprob| of its eager vs the same full weights eager in one process (TP=1), on
    # the first case; judged against the logprob tolerance. None: a single-process cell (or real weights).
    tp1_logprob_diff: float | None = None


class LatencyMetrics(StoredModel):
    """Latency per prompt token count: eager and graph medians, and the graph's speedup."""

    latency_ms: dict[int, Latency] = Field(default_factory=dict)
    speedup: dict[int, float | None] = Field(default_factory=dict)

    def graph_latencies(self) -> dict[int, float]:
        """Graph latency (ms) per token count, the measured ones only."""
        return {n: v.graph for n, v in self.latency_ms.items() if v.graph is not None}


class ProcessMetrics(StoredModel):
    """The processes the cell ran as (the launcher's): fresh repeats, ranks and GPUs, and where its time went."""

    repeats: int | None = None  # fresh processes the cell ran in (--repeats); None: one
    repeat_statuses: list[str] = Field(default_factory=list)  # with --repeats: each fresh process's status
    # The GPUs a CUDA cell holds (its ranks: pcg_core.known.world_size), or, refused, would need; None: a CPU cell or
    # a row from before. rank_statuses: each rank's status, for a cell of several (harness/launcher/ranks.py: the
    # cell's outcome is rank 0's).
    gpus: int | None = None
    rank_statuses: list[str] = Field(default_factory=list)
    # run_cell's own time, load to latency: the record's duration_s adds the worker process around it.
    cell_s: float | None = Field(default=None, validation_alias=AliasChoices("cell_s", "duration_s"))
    # Seconds in each phase run_cell reports (load, eager, reference, capture, run, judge, latency): where a cell's
    # time goes.
    phase_s: dict[str, float] = Field(default_factory=dict)
    # The most device memory the cell's process reserved through torch's allocator (max_memory_reserved; the CUDA
    # context and the libraries' own workspaces come on top, ~1 GiB): what a device call running cells side by side
    # must leave it. None: a CPU cell or a row from before.
    peak_gpu_bytes: int | None = None


GROUPS: dict[str, type[StoredModel]] = {"settings": CellSettings, "quant": QuantMetrics, "capture": CaptureMetrics,
                                        "memory": MemoryMetrics, "judge": JudgeMetrics, "latency": LatencyMetrics,
                                        "process": ProcessMetrics}
# Each metric's group, by its name (names are unique over the groups): how a flat row (every row stored before the
# groups, and uploads written by older versions) is read, and where a scalar column of the reports lives.
GROUP_OF: dict[str, str] = {name: g for g, cls in GROUPS.items() for name in cls.model_fields}
GROUP_OF["duration_s"] = "process"  # cell_s's name in rows older still
assert len(GROUP_OF) == sum(len(c.model_fields) for c in GROUPS.values()) + 1, "a metric name in two groups"


def nest_flat(data: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics dict with every flat key (a row from before the groups) moved into its group; a grouped value wins
    over a flat one of the same name."""
    out = {k: v for k, v in data.items() if k not in GROUP_OF}
    for key, value in data.items():
        group = GROUP_OF.get(key)
        if group is None:
            continue
        held = out.get(group)
        if held is None:
            out[group] = {key: value}
        elif isinstance(held, Mapping):
            out[group] = {key: value, **held}
    return out


class CellMetrics(StoredModel):
    """What a cell measured, grouped by who measures it: the run's settings, quantization, capture, memory, the
    judge, the suite's coverage, latency and the processes. A field is None when the cell ended before measuring it
    (a crash, an unsupported model), so "not measured" never reads as zero. Rows stored flat (before the groups)
    read the same."""

    settings: CellSettings = Field(default_factory=CellSettings)
    quant: QuantMetrics = Field(default_factory=QuantMetrics)
    capture: CaptureMetrics = Field(default_factory=CaptureMetrics)
    memory: MemoryMetrics = Field(default_factory=MemoryMetrics)
    judge: JudgeMetrics = Field(default_factory=JudgeMetrics)
    coverage: SuiteCoverage | None = None
    latency: LatencyMetrics = Field(default_factory=LatencyMetrics)
    process: ProcessMetrics = Field(default_factory=ProcessMetrics)

    @model_validator(mode="before")
    @classmethod
    def _flat_rows(cls, data: Any) -> Any:
        return nest_flat(data) if isinstance(data, Mapping) else data

    def value(self, name: str) -> Any:
        """Metric `name` (a field of one of the groups) wherever it lives."""
        return getattr(getattr(self, GROUP_OF[name]), name)

    def measured(self) -> dict[str, Any]:
        """Every measured metric by its name, the groups flattened (names are unique over them): the cell page's
        table, the API's `metrics` and the upload checks read this one shape."""
        dumped = self.model_dump(mode="python", exclude_defaults=True)
        out: dict[str, Any] = {}
        for key, value in dumped.items():
            out.update(value if key in GROUPS else {key: value})
        return out

    @classmethod
    def lenient(cls, data: Any) -> CellMetrics:
        """Stored metrics, whatever their shape: a value that does not read as its field's type is dropped, so
        one odd value (an upload from before the type existed could hold any JSON) never loses the row."""
        data = nest_flat(data) if isinstance(data, Mapping) else {}
        while True:
            try:
                return cls.model_validate(data)
            except ValidationError as e:
                bad = [err["loc"][:2] for err in e.errors() if err["loc"]]
                dropped = False
                for loc in bad:
                    dropped |= _drop(data, loc)
                if not dropped:
                    return cls()


def _drop(data: dict[str, Any], loc: tuple[Any, ...]) -> bool:
    """Remove the value at `loc` (a key, or a group then a key); whether anything was there."""
    head = loc[0]
    if head not in data:
        return False
    if len(loc) > 1 and isinstance(data[head], dict) and loc[1] in data[head]:
        data[head] = {k: v for k, v in data[head].items() if k != loc[1]}
        return True
    del data[head]
    return True


# The per-cell scalars the reports' flat table carries as columns (by metric name: CellMetrics.value reads them).
SCALAR_METRICS = ("token_match", "max_prompt_logprob_diff", "max_output_logprob_diff", "max_prompt_kl", "max_decode_kl",
                  "max_same_padding_diff", "capture_s", "compile_s", "trace_s", "graph_pool_bytes", "pieces",
                  "graphs_captured", "eager_fallbacks", "kv_bytes_per_token")
