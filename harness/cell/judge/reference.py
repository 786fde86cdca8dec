"""The judge's reference layer (layer 6; policy.py numbers the layers): is *eager* right?

The graph's layers (2 to 5) compare the graph candidate with pcg's own eager run, so a kernel or an attention
backend that is wrong in eager is wrong under graphs alike and passes (the FP8 block GEMM did, for every K/128 not
a multiple of 4). This layer holds eager to references that share none of pcg's fast paths:

- **transformers**: pcg's eager prompt and output logprobs against transformers' own forward of the same weights (its
  attention implementation, MLA unabsorbed, unpadded: sequences of one length as rows of one batch, teacher-forced on
  eager's greedy tokens), every kernel replaced by the math it is held to (pcg_core.quant.twin.reference_twin), in
  float32. The bounds come from that reference's own noise, times NOISE_MULT, never under a per-dtype floor: in half
  precision the same forward in the cell's dtype; in float32 transformers' other attention implementation (or a
  rounding-step nudge). Mean and max |Δlogprob| over positions are both held; a greedy token that is not the
  reference's argmax must be a near-tie. Float32 with an FP8 KV cache: each position past what a chance FP8 turn does
  there (kv_reference.py's chance twins). Float32 cells whose activations are quantized are held on the float twin
  instead (their quantizers turn 1e-7 into whole rounding steps, chaotically), their quantized layers by the kernel
  check.
- **kernels** (quantized cells): on synthetic bf16 weights the output distribution is flat enough that a garbage
  GEMM moves a logprob by only a few nats, so the kernels are also held per layer, on hidden states: pcg's eager
  engine with the kernels against the same engine on the reference twin (same activation quantization, dequantized
  weights, float32 accumulation: what differs is accumulation order and half-precision rounding), each attention's
  input and the last hidden state, relative error against NOISE_MULT × the reference's own half-precision noise
  at that layer (or a floor).
- **scheme cost** (reported, never judged): the reference math against the float twin (no activation quantizer).

What cannot run (out of memory, a model transformers' forward refuses) is `not_measured` with the reason, never a
silent pass.
"""

from __future__ import annotations

import functools
import gc
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from harness.cell.judge.kv_reference import AMBIGUOUS, CHANCE_TWINS, round_kv, text_only
from harness.cell.judge.lockstep import rel_diff
from harness.cell.judge.padding import float32_attention
from harness.cell.judge.tolerances import LOGPROB_TOL
from harness.cell.prompts import Case, run_case
from harness.metrics import ReferenceCheck
from pcg_core.attention.kv_cache import KVScales
from pcg_core.config import EngineConfig
from pcg_core.engine import Engine, SequenceOutput
from pcg_core.engine.engine import LOGITS_CHUNK, head_logits
from pcg_core.engine.kv_scales import kv_scales_of
from pcg_core.model.mla import uninstall_mla
from pcg_core.model.qwen3_next import uninstall_gated_deltanet
from pcg_core.model.vision import Image
from pcg_core.quant.layers.linear import scheme_of
from pcg_core.quant.schemes.int4 import Int4Scheme
from pcg_core.quant.schemes.w8a8 import Scheme
from pcg_core.quant.twin import float_twin, reference_twin

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# How far beyond the reference's own half-precision noise (the same forward in the cell's dtype against float32)
# pcg's eager may sit: pcg and transformers round at different places, so each lands about that far from float32;
# a fault moves the output by far more (a garbage GEMM: relative error ~1e3; an attention mask off by one: whole
# nats at the rows it touches).
NOISE_MULT = 4.0
# Floors, where the measured noise is ~0 (float32 cells: the reference is float32 itself). Measured on the CPU
# smoke matrix (float32, 20 seeds): pcg's eager vs transformers ≤ ~1e-5 mean, ~1e-4 max.
MEAN_FLOOR = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 1e-2}
MAX_FLOOR = LOGPROB_TOL
# Relative error of a layer's hidden states, kernels vs reference math, where the reference shows no noise.
HIDDEN_FLOOR = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 5e-3}


def reference_cases(cases: list[Case]) -> tuple[list[Case], Case]:
    """The cases the layer runs: several sequences of one layout, the decode case (sequences leaving at different
    steps), the chunked prefill (positions past every bucket) and the most concurrent case (an engine fault that
    shows only with many sequences in one forward is eager's too: only this layer sees it); and the one-sequence
    layout prefill whose hidden states the kernel check compares."""
    def first(prefix: str, contains: str = "") -> Case | None:
        return next((c for c in cases if c.name.startswith(prefix) and contains in c.name), None)

    widest = max((c for c in cases if c.name.startswith("concurrent_")), key=lambda c: len(c.prompts), default=None)
    chosen = [c for c in (first("layout_", "_1_"), first("decode_"), first("chunked_"), widest, first("shared_prefix_"),
                          first("vision_mixed")) if c is not None] or cases[:1]
    return chosen, first("layout_", "_0_") or cases[0]


class MalformedEager(ValueError):
    """pcg's eager outputs do not have the shape their prompts call for (a logprob per position)."""


@dataclass
class _Positions:
    """Per position of the sequences compared: pcg's eager logprob of the next token, the reference's (float32
    and in the cell's dtype), and at output positions whether eager's greedy token beats the reference's argmax."""

    eager: list[float]
    ref32: list[float]
    ref16: list[float]
    flips: list[tuple[str, float, int]]  # (where, the reference's margin of its argmax over eager's token, position)
    where: list[str] = field(default_factory=list)  # "case[sequence] position p", per position
    # float32 with an FP8 KV cache: per position, the farthest the chance twins (every K/V value within a band of an
    # FP8 midpoint turned) land from ref32 — what a chance turn of pcg's own can do there (kv_reference.py)
    chance: list[float] | None = None


def _attention_implementation(model: PreTrainedModel) -> str:
    """transformers' SDPA where it computes what the model needs; its eager attention (plain math: sinks, soft-cap,
    our own modules' functions) elsewhere."""
    cfg = model.config
    special = any(getattr(m, "sinks", None) is not None for m in model.modules()) or \
        getattr(cfg, "attn_logit_softcapping", None) or not type(model).__module__.startswith("transformers.")
    return "eager" if special else "sdpa"


def _hf_twin(model: PreTrainedModel, float32: bool, attention: str, nudge: bool = False,
             make_twin: Callable[[PreTrainedModel, bool], PreTrainedModel] = reference_twin,
             kv_scales: KVScales | None = None, kv_turn: float = 0.0, kv_row: bool = False) -> PreTrainedModel:
    """The reference twin run as transformers' own model. `nudge`: its input embeddings moved by one float32 rounding
    step (2^-23 relative, random sign per value): what any other float32 implementation's summation order does to
    them. Where nothing amplifies it the output moves by ~1e-7; an activation quantizer turns it into whole rounding
    steps, and this twin measures by how much (the float32 cells' noise). `kv_scales`: K and V rounded as an FP8
    KV cache with those scales holds them (kv_reference.py); `kv_turn`: the values that near (relative) an FP8
    midpoint rounded the other way (AMBIGUOUS: what a float32 summation order could turn, the noise twin's);
    `kv_row`: relative to the row's RMS where that is larger (the chance twins', kv_reference.CHANCE_TWINS)."""
    twin = make_twin(model, float32)
    uninstall_mla(twin)
    uninstall_gated_deltanet(twin)  # transformers' own Gated DeltaNet (its conv and delta rule, no state pool)
    if kv_scales is None:
        twin.config._attn_implementation = attention
    else:  # K and V rounded in the text model's attention only: a VLM's vision tower has no KV cache
        twin.config._attn_implementation = text_only(twin.config, round_kv(twin, attention, kv_scales, kv_turn, kv_row), attention)
    if nudge:
        twin.get_input_embeddings().register_forward_hook(_nudge)
    return twin


def _nudge(module: torch.nn.Module, args, out: torch.Tensor) -> torch.Tensor:
    g = torch.Generator(device=out.device).manual_seed(out.shape[-2])
    sign = torch.randint(0, 2, out.shape, generator=g, device=out.device, dtype=out.dtype) * 2 - 1
    return out * (1 + sign * 2.0**-23)


# A forward of the reference holds at most this many tokens: sequences of one length run as one batch of unpadded rows
# (a concurrency case's hundreds of short sequences in a few forwards instead of one each).
BATCH_TOKENS = 2048
_Next = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@torch.no_grad()
def _hf_next_tokens(twin: PreTrainedModel, seqs: Sequence[list[int]], device: torch.device,
                    images: Sequence[Sequence[Image] | None]) -> list[_Next]:
    """transformers' forward of each seq[:-1] (unpadded, no cache): for every position the logprob of the next token
    of seq, the argmax and its logprob (float32, CPU), per sequence. Text sequences of one length share a forward
    (rows of one batch, no padding, each row its own causal attention: what one sequence at a time computes, in
    another GEMM shape). With images (a VLM), one sequence at a time through the whole multimodal model: its own
    vision tower, placeholder merge, get_rope_index and deepstack, none of pcg's pre-process."""
    out: dict[int, _Next] = {}
    by_length: dict[int, list[int]] = {}
    for k, (seq, ims) in enumerate(zip(seqs, images)):
        if ims:
            ids = torch.tensor(seq[:-1], device=device)[None]
            inner = getattr(twin, "model")  # the VLM's multimodal model (vision tower, merge, rope index)
            hidden = inner(input_ids=ids, use_cache=False,
                           pixel_values=torch.cat([im.pixel_values for im in ims]).to(device),
                           image_grid_thw=torch.tensor([im.grid_thw for im in ims], device=device),
                           mm_token_type_ids=(ids == twin.config.image_token_id).int()).last_hidden_state
            out[k] = _next_of(twin, hidden, [seq], device)[0]
        else:
            by_length.setdefault(len(seq), []).append(k)
    for n, ks in by_length.items():
        per = max(1, BATCH_TOKENS // max(1, n - 1))
        for s in range(0, len(ks), per):
            part = ks[s : s + per]
            ids = torch.tensor([seqs[k][:-1] for k in part], device=device)
            positions = torch.arange(ids.shape[1], device=device)[None].expand(len(part), -1)
            hidden = twin.get_decoder()(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
            for k, r in zip(part, _next_of(twin, hidden, [seqs[k] for k in part], device)):
                out[k] = r
    return [out[k] for k in range(len(seqs))]


def _next_of(twin: PreTrainedModel, hidden: torch.Tensor, seqs: list[list[int]], device: torch.device) -> list[_Next]:
    """Per row of hidden [rows, positions, H]: each position's logprob of its sequence's next token, the argmax and
    its logprob, through the LM head a chunk of positions at a time."""
    rows, n = hidden.shape[:2]
    flat = hidden.reshape(rows * n, -1)
    targets = torch.tensor([seq[1:] for seq in seqs], device=device).reshape(-1)
    chosen, argmax, top = [], [], []
    for s in range(0, flat.shape[0], LOGITS_CHUNK):
        lp = torch.log_softmax(head_logits(twin.get_output_embeddings(), flat[s : s + LOGITS_CHUNK]), dim=-1)
        chosen.append(lp.gather(1, targets[s : s + LOGITS_CHUNK, None])[:, 0])
        best = lp.max(dim=-1)
        argmax.append(best.indices)
        top.append(best.values)
    parts = [torch.cat(x).cpu().reshape(rows, n) for x in (chosen, argmax, top)]
    return [(parts[0][r], parts[1][r], parts[2][r]) for r in range(rows)]


def _transformers_positions(model: PreTrainedModel, dtype: str, cases: list[Case],
                            outputs: dict[str, list[SequenceOutput]], attention: str,
                            make_twin: Callable[[PreTrainedModel, bool], PreTrainedModel] = reference_twin,
                            kv_scales: KVScales | None = None) -> _Positions:
    device = next(model.parameters()).device
    seqs = [(c.name, i, o, c.images[i] if c.images else None) for c in cases for i, o in enumerate(outputs[c.name])]
    make_twin = functools.partial(_hf_twin, make_twin=make_twin, kv_scales=kv_scales)
    ref32: PreTrainedModel | None
    ref16: PreTrainedModel | None
    ref32 = make_twin(model, True, attention)
    # The reference's own noise: in half precision the same forward in the cell's dtype; in float32 transformers'
    # other attention implementation (another summation order at every layer, as pcg's own), or where the model has
    # only one, the forward nudged by a rounding step (_hf_twin); with an FP8 KV cache, its roundings a float32
    # summation order could land either way landed the other way (kv_reference.py).
    if dtype != "float32":
        ref16 = make_twin(model, False, attention)
    elif attention == "sdpa":
        ref16 = make_twin(model, True, "eager", kv_turn=AMBIGUOUS)
    else:
        ref16 = make_twin(model, True, attention, nudge=True, kv_turn=AMBIGUOUS)
    chances = [make_twin(model, True, attention, kv_turn=band, kv_row=row) for band, row in CHANCE_TWINS] \
        if dtype == "float32" and kv_scales else []
    pos = _Positions([], [], [], [], chance=[] if chances else None)
    try:
        for name, i, o, _ in seqs:
            skip, n = o.cached_tokens, len(o.prompt_ids) + len(o.output_ids) - 1
            got = len(o.prompt_logprobs or []) + len(o.output_logprobs)
            if got != n - skip:  # eager's own output is malformed: wrong, not unmeasurable
                raise MalformedEager(f"{name}[{i}]: pcg's eager gave {got} logprobs for the {n - skip} "
                                     f"positions of its prompt and output (prefix-cached: {skip})")
        full = [o.prompt_ids + o.output_ids for _, _, o, _ in seqs]
        ims = [images for *_, images in seqs]
        r32 = _hf_next_tokens(ref32, full, device, ims)
        r16 = _hf_next_tokens(ref16, full, device, ims)
        moved = [_hf_next_tokens(c, full, device, ims) for c in chances]
        for k, ((name, i, o, _), seq) in enumerate(zip(seqs, full)):
            skip = o.cached_tokens  # positions a prefix cache gave it: eager computed them in an earlier sequence
            (lp32, arg32, top32), lp16 = r32[k], r16[k][0]
            base = len(pos.eager)
            pos.eager += [*(o.prompt_logprobs or []), *o.output_logprobs]
            pos.ref32 += lp32[skip:].tolist()
            pos.ref16 += lp16[skip:].tolist()
            if chances and pos.chance is not None:  # torch.maximum keeps a NaN: it fails
                far = functools.reduce(torch.maximum, [(m[k][0] - lp32).abs() for m in moved])
                pos.chance += far[skip:].tolist()
            pos.where += [f"{name}[{i}] position {p}" for p in range(skip, len(seq) - 1)]
            start = len(o.prompt_ids) - 1
            for t, token in enumerate(o.output_ids):
                if token != int(arg32[start + t]):
                    pos.flips.append((f"{name}[{i}] output {t}: eager {token} vs reference {int(arg32[start + t])}",
                                      float(top32[start + t] - lp32[start + t]), base + start + t - skip))
    finally:
        ref32 = ref16 = None
        chances.clear()
        _free()
    return pos


def _mean_max(values: Iterable[float]) -> tuple[float, float]:
    v = torch.tensor(list(values), dtype=torch.float64)
    if not v.numel():
        return 0.0, 0.0
    if torch.isnan(v).any():
        return math.nan, math.nan
    return float(v.mean()), float(v.max())


def quantizes_activations(model: PreTrainedModel) -> bool:
    """Whether any layer quantizes its input (8-bit schemes, W4A8): a rounding step there turns a summation-order
    difference into a jump at that token's row."""
    for module in model.modules():
        scheme = scheme_of(module)
        if isinstance(scheme, Scheme) or (isinstance(scheme, Int4Scheme) and scheme.activations is not None):
            return True
    return False


def _judge_transformers(check: ReferenceCheck, pos: _Positions, dtype: str) -> list[str]:
    """The transformers comparison's numbers into `check`; returns what failed. With chance twins (float32, FP8 KV
    cache) each position's error is judged past NOISE_MULT × what a chance FP8 turn does at that position (a turn
    carried by the KV moves many later positions a little, so the mean is judged so too)."""
    err = [abs(a - b) for a, b in zip(pos.eager, pos.ref32)]
    noise = [abs(a - b) for a, b in zip(pos.ref16, pos.ref32)]
    check.positions = len(err)
    check.mean_logprob_diff, check.max_logprob_diff = _mean_max(err)
    check.mean_noise, check.max_noise = _mean_max(noise)
    check.mean_bound = max(MEAN_FLOOR[dtype], NOISE_MULT * check.mean_noise)
    check.max_bound = max(MAX_FLOOR[dtype], NOISE_MULT * check.max_noise)
    judged, mean = err, check.mean_logprob_diff
    if pos.chance is not None:  # a NaN on either side stays a NaN: it fails
        judged = [e - NOISE_MULT * c if math.isnan(e) or math.isnan(c) else max(0.0, e - NOISE_MULT * c)
                  for e, c in zip(err, pos.chance)]
        check.chance_turns = sum(not e <= check.max_bound and j <= check.max_bound for e, j in zip(err, judged))
        check.chance_adjusted_mean = mean = _mean_max(judged)[0]
    bad = [(where, margin) for where, margin, k in pos.flips
           if not margin <= 2 * check.max_bound + (2 * NOISE_MULT * pos.chance[k] if pos.chance else 0.0)]
    check.token_flips = len(bad)
    problems = []
    against = f"transformers' {check.attention} forward in float32"
    beyond = "" if pos.chance is None else " beyond what a chance FP8 turn does at each position"
    if not mean <= check.mean_bound:  # NaN fails
        problems.append(f"pcg's eager prompt/output logprobs differ from {against} by {mean:.3g} on average{beyond} > "
                        f"{check.mean_bound:.3g} (the reference's own {dtype} noise {check.mean_noise:.3g} × "
                        f"{NOISE_MULT:g}, floor {MEAN_FLOOR[dtype]:g})")
    over = [k for k, j in enumerate(judged) if not j <= check.max_bound]
    check.positions_over_max = len(over)
    if over:
        at = max(over, key=lambda k: (math.isnan(judged[k]), judged[k]))
        problems.append(f"at worst by {err[at]:.3g}{beyond and f' ({judged[at]:.3g} beyond a chance turn there)'} > "
                        f"{check.max_bound:.3g} (noise {check.max_noise:.3g} × {NOISE_MULT:g}, floor {MAX_FLOOR[dtype]:g})"
                        f" at {len(over)} positions, the worst {pos.where[at] if at < len(pos.where) else 'unnamed'}")
    if bad:
        problems.append(f"{len(bad)} greedy token(s) not the reference's argmax beyond a near-tie "
                        f"(2 × {check.max_bound:.3g}{beyond and ' plus a chance turn'}): {bad[0][0]}, the reference's "
                        f"margin {bad[0][1]:.3g}")
    return problems


def _stages(engine: Engine, case: Case) -> list[torch.Tensor]:
    """Hidden states of the case's one packed prefill through pcg's eager engine, unpadded: every attention's input
    (the query: it carries the projections before it) and the last hidden state, float32."""
    seen: dict[int, torch.Tensor] = {}
    batch = engine.prefill_batch([list(p) for p in case.prompts], images=case.image_lists)
    hidden = engine.forward(batch, eager=True, observer=lambda layer, q: seen.__setitem__(layer, q.float().clone()))
    return [seen[i] for i in sorted(seen)] + [hidden.float()]


def _engine_stages(model: PreTrainedModel, config: EngineConfig, case: Case) -> list[torch.Tensor]:
    engine: Engine | None
    engine = Engine(model, config)
    try:
        return _stages(engine, case)
    finally:
        engine = None
        _free()


def _judge_kernels(check: ReferenceCheck, model: PreTrainedModel, config: EngineConfig, case: Case) -> list[str]:
    """Kernels vs reference math per layer (quantized cells), and the scheme's own cost."""
    eager = replace(config, capture=replace(config.capture, backend="disabled"))
    f32 = replace(eager, dtype="float32", attention=float32_attention(config.attention, config.device))
    got = _engine_stages(model, eager, case)
    ref = _engine_stages(reference_twin(model), eager, case)
    half = config.dtype != "float32"
    ref32 = _engine_stages(reference_twin(model, float32=True), f32, case) if half else ref
    check.scheme_rel = round(rel_diff(ref32[-1], _engine_stages(float_twin(model), f32, case)[-1]), 6)
    floor = HIDDEN_FLOOR[config.dtype]
    worst: tuple[float, float, str, float] | None = None
    worst_ratio = -1.0  # the first layer over its bound (where a fault enters), else the closest
    for i, (a, b, c) in enumerate(zip(ref, got, ref32)):
        rel, noise = rel_diff(a, b), (rel_diff(c, a) if half else 0.0)
        bound = max(floor, NOISE_MULT * noise)
        ratio = math.inf if math.isnan(rel) else rel / bound
        if ratio > worst_ratio:
            label = f"attention {i}'s input" if i < len(ref) - 1 else "the last hidden state"
            worst, worst_ratio = (rel, bound, label, noise), ratio
        if worst_ratio > 1:
            break
    assert worst is not None  # one stage at least: the last hidden state
    check.kernel_rel, check.kernel_bound, check.kernel_layer, check.kernel_noise = worst
    if worst_ratio <= 1:
        return []
    return [f"the kernels differ from their reference math at {check.kernel_layer} by {check.kernel_rel:.3g} "
            f"(relative) > {check.kernel_bound:.3g} (the reference's own {config.dtype} noise there "
            f"{check.kernel_noise:.3g} × {NOISE_MULT:g}, floor {floor:g})"]


def reference_layer(model: PreTrainedModel, config: EngineConfig, cases: list[Case],
                    outputs: dict[str, list[SequenceOutput]], quantized: bool) -> ReferenceCheck:
    """The layer's verdict on pcg's eager `outputs` of `cases` (run with `config`, KV capacity included)."""
    chosen, prefill = reference_cases(cases)
    attention = _attention_implementation(model)
    check = ReferenceCheck(attention=attention, kv_cache=config.kv_cache)
    try:
        # An FP8 KV cache: transformers' twin rounds K and V as the cache does, with the scales the engine read.
        kv = None if config.kv_cache == "auto" else kv_scales_of(model)
        if config.dtype == "float32" and quantizes_activations(model):
            # In float32 the activation quantizers are the only noise, and chaotic: pcg's and transformers'
            # summation orders (1e-7 apart) land a value on either side of a rounding step, the KV carries it to
            # later tokens, and neither noise run need land one (2 of 20 seeds on the CPU smoke matrix failed so).
            # So pcg's engine is held exactly on the float twin (same weights dequantized, no quantizer), and the
            # quantized layers by the kernel check.
            check.subject = "the float twin"
            outputs = _float_twin_outputs(model, config, chosen)
            positions = _transformers_positions(model, "float32", chosen, outputs, attention,
                                                make_twin=lambda m, _: float_twin(m), kv_scales=kv)
        else:
            positions = _transformers_positions(model, config.dtype, chosen, outputs, attention, kv_scales=kv)
        problems = _judge_transformers(check, positions, config.dtype)
        if quantized:
            problems += _judge_kernels(check, model, config, prefill)
    except MalformedEager as e:
        check.status, check.reason = "fail", str(e)[:1800]
        return check
    except Exception as e:  # noqa: BLE001 - out of memory, a forward transformers refuses: said, never a silent pass
        check.status, check.reason = "not_measured", f"{type(e).__name__}: {e}"[:1000]
        _free()
        return check
    check.status = "fail" if problems else "pass"
    check.reason = "; ".join(problems)[:1800]
    return check


def _float_twin_outputs(model: PreTrainedModel, config: EngineConfig, cases: list[Case]) -> dict[str, list[SequenceOutput]]:
    """pcg's eager engine on the model's float twin (float32, no quantizer), the cases run as the suite runs them."""
    engine: Engine | None
    engine = Engine(float_twin(model), replace(config, dtype="float32", capture=replace(config.capture, backend="disabled")))
    try:
        return {c.name: run_case(engine, c, 2) for c in cases}
    finally:
        engine = None
        _free()


def _free() -> None:
    """Twins and engines hold reference cycles (bound forwards, the capture backend): collected before the next
    one is built, so a big model's reference runs do not stack up on the GPU."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

