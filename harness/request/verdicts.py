"""One verdict per matrix axis — model, quant, attention, parallel, graph, kv_cache — each {ok, reason}.

Everything is read from `pcg_core.capabilities.capabilities()` (and `unsupported_reason` for the model), the
same table the matrix pre-check reads; no list of what the runtime can do is kept here. As the runtime grows
(an architecture, a quantization scheme, a parallel mode) the verdicts follow without a change here.

- model:     the architecture is in the runtime's table (`unsupported_reason` is None).
- quant:     each scheme asked for (--quant, else the checkpoint's own method or "none") is in the table's
             quantization list.
- attention: an attention backend exists, and every attention feature the model exercises (mla,
             sliding_window, sinks, linear_attention) is exercised by some architecture in the table.
- parallel:  each TP size asked for (--tp, else the smallest that fits the bf16 weights) divides the heads,
             fits the weights, and is a parallel mode of the runtime ("tp<N>"). A size the runtime does not run
             yet is a what-if: the verdict says so first, then what the heads and the weights would allow.
- kv_cache:  the KV-cache dtypes the runtime stores (auto, fp8_e4m3) and the attention backends that read an FP8
             cache, and whether the checkpoint declares an FP8 KV cache (its scales then used, else calibrated).
- graph:     the runtime can run the model and has a capture backend other than `disabled`; a backend that
             declares it (`full`) also needs a capturable attention backend, and capturable split ops for the
             model's features (linear_attention's pcg::linear_attention is not: full cannot, piecewise and
             breakable run it between graphs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from harness.request.features import ATTENTION_FEATURES
from harness.request.quantization import describe
from harness.shape.params import H200_BYTES, HEADROOM, MAX_SIZE

AXES = ("model", "quant", "attention", "parallel", "graph", "kv_cache")


def _v(ok: bool, reason: str) -> dict[str, Any]:
    return {"ok": bool(ok), "reason": reason}


def table_features(caps: dict[str, Any]) -> set[str]:
    """Features some architecture in the runtime's table exercises."""
    return {feat for feats in caps["architectures"].values() for feat in feats}


def model_verdict(architecture: str, reason: str | None, features: list[str], caps: dict[str, Any]) -> dict[str, Any]:
    if reason is not None:
        return _v(False, reason)
    feats = caps["architectures"].get(architecture) or []
    return _v(True, f"{architecture} is in the runtime's architecture table" + (f" (exercises {', '.join(feats)})" if feats else ""))


def quant_verdict(wanted: list[str], checkpoint: dict[str, Any] | None, caps: dict[str, Any], features: Sequence[str] = (),
                  detected: str | None = None, refused: str | None = None) -> dict[str, Any]:
    """Whether the runtime runs each wanted quantization on this model. A word is a scheme of the runtime's
    table, or the checkpoint's own format (then what the loader makes of its declaration decides: `detected`,
    the scheme it maps onto, or `refused`, why not; the loader's per-feature limits then apply)."""
    have, formats, schemes = caps["quantization"], caps.get("quant_formats", []), caps.get("quant_schemes", {})
    ckpt = f"checkpoint: {describe(checkpoint)}"
    problems, runs = [], []
    for w in wanted:
        scheme = w
        if checkpoint is not None and w == checkpoint["method"] and w in formats:
            if refused:
                problems.append(f"{w}: {refused}")
                continue
            scheme = detected or w
            limits = schemes.get(scheme, {}).get("checkpoint_limits", {})
            if lacks := [f"{f}: {limits[f]}" for f in features if limits.get(f)]:
                problems.append(f"{w} ({scheme}) checkpoint of this model: {'; '.join(lacks)}")
                continue
        elif w not in have:
            problems.append(f"{w} is not supported by the runtime yet (supported: {', '.join(have)})")
            continue
        elif checkpoint is not None and w == checkpoint["method"] and (why := schemes.get(w, {}).get("checkpoints")):
            problems.append(f"{w} checkpoint: {why}")  # the runtime runs the scheme, not yet this checkpoint's format
            continue
        runs.append(w if scheme == w else f"{w} (as {scheme})")
    if problems:
        return _v(False, f"{'; '.join(problems)}; {ckpt}; the trim and tiny variants still run on synthetic weights")
    note = ""
    if checkpoint is not None and checkpoint["method"] not in wanted:
        note = f"; the published weights are {checkpoint['method']}, so {', '.join(wanted)} means synthetic or dequantized weights"
    return _v(True, f"{', '.join(runs)} supported by the runtime; {ckpt}{note}")


def attention_verdict(features: list[str], heads: int | None, kv_heads: int | None, caps: dict[str, Any]) -> dict[str, Any]:
    backends = caps["attention_backends"]
    if not backends:
        return _v(False, "the runtime has no attention backend")
    needed = [f for f in features if f in ATTENTION_FEATURES]
    names = ", ".join(_backend_words(n, b, needed) for n, b in backends.items())
    handled = table_features(caps)
    missing = [f for f in needed if f not in handled]
    if missing:
        return _v(False, f"{', '.join(missing)}: no architecture in the runtime's table exercises "
                         f"{'it' if len(missing) == 1 else 'them'} yet (it exercises: {', '.join(sorted(handled)) or 'nothing beyond plain attention'}); "
                         f"backends: {names}")
    shape = f"{heads} query / {kv_heads} KV heads" if heads else "attention"
    kind = ", ".join(needed) if needed else ("GQA" if heads and kv_heads and kv_heads < heads else "multi-head")
    return _v(True, f"{kind} attention, {shape}; backends: {names}")


def _backend_words(name: str, b: dict[str, Any], needed: list[str]) -> str:
    """A backend as the verdict lists it: capturable or not, where it cannot run, which of the model's needs it lacks."""
    words = ["capturable" if b["capturable"] else "not capturable"]
    words += [f"not on {d}" for d, why in b.get("devices", {}).items() if why]
    lacks = [f for f in needed if b.get("features", {}).get(f)]
    if lacks:
        words.append(f"lacks {', '.join(lacks)}")
    return f"{name} ({'; '.join(words)})"


def parallel_verdict(wanted: list[int] | None, tp_ok: list[int], divides: list[int], ep_ok: list[int], h200s: int | None,
                     bf16_bytes: int | None, experts: int | None, caps: dict[str, Any],
                     model_reason: Callable[[int], str | None] = lambda t: None) -> dict[str, Any]:
    """tp_ok: TP sizes up to 8 that divide the heads; divides: those plus any size asked for that divides them.
    model_reason(t): why the runtime's sharding cannot run this model at TP t (pcg_core.distributed), or None."""
    modes = caps["parallel"]
    have = ", ".join(modes)
    ep = f"; EP sizes dividing its {experts} experts: {', '.join(map(str, ep_ok))}" if experts else ""
    if wanted is None:  # none asked for: the smallest TP size that holds the bf16 weights
        if h200s is None:
            return _v(False, f"the parameter count is unknown, so no TP size can be chosen; TP sizes dividing the heads: "
                             f"{', '.join(map(str, tp_ok)) or 'none'}{ep}")
        fitting = [t for t in tp_ok if t >= h200s]
        if not fitting:
            return _v(False, f"the bf16 weights need {h200s} H200s (with {HEADROOM:.0%} headroom), more than any TP size up to "
                             f"{MAX_SIZE} that divides the heads ({', '.join(map(str, tp_ok)) or 'none'}); trim and tiny "
                             f"variants still fit one GPU{ep}")
        wanted = [fitting[0]]
        lead = f"the bf16 weights need {h200s} H200(s) with {HEADROOM:.0%} headroom, so TP {wanted[0]}: "
    else:
        lead = ""
    problems: list[str] = []
    fine: list[str] = []
    for t in wanted:
        mode = f"tp{t}"
        why = []
        if t not in divides:
            why.append(f"TP {t} does not divide the heads (sizes that do: {', '.join(map(str, tp_ok)) or 'none'})")
        if bf16_bytes is not None and t * H200_BYTES < bf16_bytes * (1 + HEADROOM):
            why.append(f"the bf16 weights need {h200s} H200s, more than {t}")
        if mode not in modes:  # nothing runs at this size: say that before what the sizes would allow
            sized = "; ".join(why) if why else f"TP {t} divides the heads and holds the bf16 weights"
            problems.append(f"{mode}: not run by the runtime yet, which runs {have} only; as a what-if, {sized}")
        else:
            if t > 1 and (reason := model_reason(t)):
                why.append(reason.removeprefix(f"{mode}: "))
            (problems if why else fine).append(f"{mode}: " + ("; ".join(why) if why else f"runs on {modes[mode]} GPU(s)"))
    return _v(not problems, lead + "; ".join(problems + fine) + ep)


def graph_verdict(supported: bool, caps: dict[str, Any], features: Iterable[str] = ()) -> dict[str, Any]:
    """features: the model's; a capturable attention backend that lacks one of its attention features does not
    count for the backends that record attention in the graph (MLA on varlen, say)."""
    backends = [b for b in caps["capture_backends"] if b != "disabled"]
    if not supported:
        return _v(False, "the runtime cannot run this architecture yet, so no capture backend can capture it")
    if not backends:
        return _v(False, "the runtime has no capture backend besides disabled (eager)")
    needed = [f for f in features if f in ATTENTION_FEATURES]
    capturable = [n for n, b in caps["attention_backends"].items()
                  if b["capturable"] and not any(b.get("features", {}).get(f) for f in needed)]
    from pcg_core.capabilities import split_op_capture_reason  # the pre-check's wording

    reason = f"capture backends: {', '.join(backends)}"
    for name in backends:
        if why := split_op_capture_reason(name, features, caps):
            reason += f"; {name} cannot: {why}"
        elif caps["capture_backends"][name]["requires_capturable_attention"]:
            reason += (f"; {name} capture through {', '.join(capturable)} (capturable)" if capturable
                       else f"; {name} capture needs a capturable attention backend and none is")
    return _v(True, reason)


def declared_kv_cache(quant: dict[str, Any] | None) -> str | None:
    """The checkpoint's KV-cache quantization as its config declares it (ModelOpt's kv_cache_quant_algo,
    compressed-tensors' kv_cache_scheme), in words; None if it declares none."""
    if not quant:
        return None
    if algo := quant.get("kv_cache_quant_algo"):
        return f"kv_cache_quant_algo {algo}"
    scheme = quant.get("kv_cache_scheme")
    if isinstance(scheme, dict) and scheme:
        return "kv_cache_scheme " + ", ".join(f"{k} {scheme[k]}" for k in ("type", "num_bits", "strategy") if k in scheme)
    return None


def kv_cache_verdict(quant: dict[str, Any] | None, caps: dict[str, Any]) -> dict[str, Any]:
    """FP8 KV cache: which attention backends read one, and where its scales would come from."""
    kinds = caps.get("kv_cache", {})
    if "fp8_e4m3" not in kinds:
        return _v(True, f"kv_cache {', '.join(kinds) or 'auto'} only: K and V in the model's dtype")
    readers = [n for n, b in caps["attention_backends"].items() if not b.get("kv_cache", {}).get("fp8_e4m3")]
    if not readers:
        return _v(False, "no attention backend reads an FP8 KV cache; kv_cache auto runs")
    declared = declared_kv_cache(quant)
    scales = (f"the checkpoint declares an FP8 KV cache ({declared}): its k/v scales are used with kv_cache fp8_e4m3"
              if declared else "the checkpoint declares no KV-cache scales: kv_cache fp8_e4m3 calibrates them "
                               "(absmax / 448 over 16-bit forwards)")
    return _v(True, f"kv_cache auto and fp8_e4m3 (FP8 read by {', '.join(readers)}); {scales}")
