"""What this runtime, on this machine, can run, gathered for the harness to pre-check cells against.

Nothing here is a second list: architectures come from the table in `model/architectures.py`, backends from
their registries with what each declares it needs, compilers and dtypes from the config. So when the runtime
grows (an architecture, a quantization scheme, an attention backend, a parallel mode) the matrix grows with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch

from pcg_core.attention import attention_backend_names, get_attention_backend
from pcg_core.capture import CaptureBackend, capture_backend_names, get_capture_backend
from pcg_core.config import COMPILERS, DTYPES, KV_CACHE_DTYPES
from pcg_core.distributed.plan import TP_DEGREES
from pcg_core.known import parse_parallel, world_size
from pcg_core.linear_attention import CAPTURABLE as LINEAR_CAPTURABLE
from pcg_core.linear_attention import WHY_NOT_CAPTURABLE as LINEAR_WHY_NOT
from pcg_core.model import architectures
from pcg_core.quant.schemes import registry as quant_registry

QUANTIZATION = ("none", *quant_registry.MATRIX_SCHEMES)  # schemes the runtime can execute (the registry's)
# Checkpoint formats the loader reads (quant_method values, and ModelOpt's hf_quant_config.json), onto those schemes.
QUANT_FORMATS = quant_registry.FORMATS
# What the loader cannot read yet in a real checkpoint of each scheme, by model-card feature (synthetic weights
# are quantized in memory). Empty for the 8-bit schemes since per-expert MoE checkpoints are read
# (quant/formats/experts.py).
QUANT_CHECKPOINT_LIMITS: dict[str, str] = {}
# int4 experts' per-expert checkpoint tensors are read too (quant/formats/experts.py), gate and up with their own
# act-order each; W4A8 / W4AFP8 experts (8-bit token activations) as well, synthetic or real.
INT4_CHECKPOINT_LIMITS: dict[str, str] = {}
# FP4 experts run quantized (synthetic weights, either layout: quant/layers/fp4_experts.py), and their checkpoint tensors
# are read: NVFP4 per expert (ModelOpt, compressed-tensors) and gpt-oss's own MXFP4 blocks.
FP4_CHECKPOINT_LIMITS: dict[str, str] = {}
# Schemes the runtime runs whose own checkpoint format the loader does not read yet (the request verdict's reason).
# (Empty since gpt-oss's MXFP4 format is read: quant/formats/checkpoint.py, layers/fp4_experts.py.)
SCHEME_CHECKPOINTS: dict[str, str] = {}
# KV-cache dtypes: what each stores and where its scales come from (which attention backends read it: their own
# `kv_caches` declarations, in the attention_backends table).
KV_CACHES: dict[str, str] = {
    "auto": "K and V in the model's dtype",
    "fp8_e4m3": "K and V in FP8 e4m3 with one scale per layer for K and one for V (MLA: one for the latent row), "
                "saturating at ±448, dequantized on read; scales from the checkpoint's FP8 KV-cache declaration, else "
                "calibrated (absmax / 448 over 16-bit forwards)",
}
# Split ops besides attention, by the model-card feature that brings them in. linear_attention is a property of its
# own split op (pcg::linear_attention over the per-sequence state pool), not an attention-backend feature: the same
# op runs under every attention backend, which serve the model's full-attention layers; what it limits is capture.
SPLIT_OPS: dict[str, dict[str, Any]] = {
    "pcg::linear_attention": {"feature": "linear_attention", "capturable": LINEAR_CAPTURABLE,
                              "why_not_capturable": None if LINEAR_CAPTURABLE else LINEAR_WHY_NOT,
                              "devices": {"cpu": None, "cuda": None},
                              "state": "per sequence and linear layer: conv state (model dtype) and float32 recurrent "
                                       "state, two versions per slot, EngineConfig.linear_state_slots slots"},
    # Tensor parallelism's collective: piecewise and breakable run it eagerly between their graphs; `full` records
    # it in its one graph (NCCL capture, uniform over ranks), which no GPU run has checked yet.
    "pcg::all_reduce_": {"feature": "tensor_parallel", "capturable": True, "why_not_capturable": None,
                         "devices": {"cpu": None, "cuda": None},  # gloo on a CPU, NCCL on CUDA
                         "in_graph": {"piecewise": False, "breakable": False, "full": True},
                         "state": "none: an in-place sum over the tensor-parallel group, named by string"},
    # Data-parallel attention's gather: a MoE block's rows from every rank (and the forward's output, after it).
    "pcg::all_gather_into_": {"feature": "data_parallel", "capturable": True, "why_not_capturable": None,
                              "devices": {"cpu": None, "cuda": None},
                              "in_graph": {"piecewise": False, "breakable": False, "full": True},
                              "state": "none: every rank's rows stacked in rank order into a buffer allocated before"},
    # Expert parallelism beside data-parallel attention (epN): each rank's tokens to the ranks holding their experts and
    # the weighted partials back, sizes read on the host; `full` reaches the experts by the all-gather form instead.
    "pcg::ep_all_to_all_": {"feature": "expert_parallel", "capturable": False,
                            "why_not_capturable": "the sizes exchanged follow the routes and are read on the host",
                            "devices": {"cpu": None, "cuda": None},
                            "in_graph": {"piecewise": False, "breakable": False, "full": None},
                            "state": "none: the rank's experts module, bound under a key the op takes"},
    # Pipeline parallelism's stage hand-off: send/recv (and the last stage's broadcast) between graphs, never in one.
    "pcg::pipeline_pass_": {"feature": "pipeline_parallel", "capturable": False,
                            "why_not_capturable": "send and receive run between graphs, as serving engines run them",
                            "devices": {"cpu": None, "cuda": None},
                            "in_graph": {"piecewise": False, "breakable": False, "full": None},
                            "state": "none: the hidden state written over the next stage's (the last stage's over "
                                     "every rank's)"},
}


def parallel_gpus(parallel: str) -> int:
    """GPUs a parallel mode takes: its ranks, pp × max(tp·dp, ep) (pcg_core.known.world_size: expert parallelism
    runs within the attention ranks, or sets the rank count where it is the larger, as epN alone does)."""
    return world_size(parallel)


# Parallel mode → GPUs it needs, for the modes the runtime runs: the rule below (tensor parallelism of the degrees
# pcg_core.distributed shards to; its experts EP = TP in all-reduce style), written out for the pre-checks.
# tpN, and tpN-epN: the same N ranks with the routed experts split by expert index instead of intermediate size
# ppN: N ranks, a contiguous stage of the decoder layers each (pcg_core.distributed.pipeline), piecewise and breakable.
# dpN: N ranks attending over their own sequences, MoE blocks over every rank's tokens
# (pcg_core.distributed.data_parallel); epN: the same, each rank holding 1/N of the routed experts whole.
PP_DEGREES = DP_DEGREES = (2, 4)  # proved on four gloo ranks (tests/harness/cell/test_run_cell_four_ranks.py)
# Modes of several kinds (pcg_core.distributed.mesh_groups lays their ranks out): two pipeline stages each running
# another mode over a stage group of its own (TP2, DP2 attention, EP2 by all-to-all, TP2 with whole experts); TP2
# attention in two data-parallel groups, the experts split by TP, by expert index within each TP group, or over all
# four ranks (tp2-ep4: the attention replicated as two DP groups, as vLLM's EP = TP × DP). Four gloo ranks each
# (tests/harness/cell/test_run_cell_four_ranks.py).
PP_STAGED = ("tp2-pp2", "pp2-dp2", "pp2-ep2", "tp2-pp2-ep2")
TP_DP = ("tp2-dp2", "tp2-dp2-ep2", "tp2-dp2-ep4", "tp2-ep4")
PARALLEL = {m: parallel_gpus(m) for m in (*(f"tp{n}" for n in TP_DEGREES), *(f"tp{n}-ep{n}" for n in TP_DEGREES if n > 1),
                                          *(f"pp{n}" for n in PP_DEGREES), *(f"dp{n}" for n in DP_DEGREES),
                                          *(f"ep{n}" for n in DP_DEGREES), *PP_STAGED, *TP_DP)}
# Graph modes a parallel kind cannot run under, and why (the matrix pre-check and a cell asked directly say it alike).
PARALLEL_GRAPH_LIMITS = {("pp", "full"): "pipeline stages hand their hidden state on between graphs (send/recv are "
                                         "never recorded), and full records the whole forward in one graph"}


def quant_unsupported_reason(quant: str, supported: Iterable[str] = QUANTIZATION, features: Iterable[str] = (),
                             real_weights: bool = False, limits: dict[str, str] | None = None) -> str | None:
    """Why the runtime cannot run quantization `quant` on a model exercising `features` (model-card words), from
    a real checkpoint or synthetic weights, or None: one wording for the matrix pre-check (which passes its
    capabilities' table) and a cell asked for it directly."""
    have, features = list(supported), list(features)
    quant = quant_registry.canonical(quant)  # an alias (fp4) is its scheme (nvfp4), in a table stored before too
    if quant not in {quant_registry.canonical(h) for h in have}:
        return f"quantization {quant!r} is not supported by the runtime yet (supported: {', '.join(have)})"
    if quant != "none" and real_weights:
        reasons = checkpoint_limits(quant) if limits is None else limits
        for f in features:
            if why := reasons.get(f):
                return f"quantization {quant}: {why}"
    return None


def checkpoint_limits(quant: str) -> dict[str, str]:
    """What the loader cannot read yet in a real checkpoint of scheme `quant`, by model-card feature."""
    weights = quant_registry.info(quant).weights if quant in QUANTIZATION[1:] else None
    if weights == "int4":
        return dict(INT4_CHECKPOINT_LIMITS)
    if weights == "fp4":
        return dict(FP4_CHECKPOINT_LIMITS)
    return dict(QUANT_CHECKPOINT_LIMITS)


_NOT_YET = {"ep": "expert parallelism over more ranks than TP with TP > 1 runs as tp2-ep4 only; tpN-epN spreads "
                  "whole experts over the N TP ranks, epN over N data-parallel attention ranks (all-to-all dispatch)",
            "pp": f"pipeline parallelism runs alone (ppN) or as two stages of another mode ({', '.join(PP_STAGED)}); "
                  "this combination is not run yet",
            "dp": f"data-parallel attention combined with other kinds runs as {', '.join(TP_DP[:3])} and pp2-dp2; "
                  "this combination is not run yet"}


def parallel_unsupported_reason(parallel: str, supported: Iterable[str] = PARALLEL, graph: str | None = None) -> str | None:
    """Why the runtime cannot run parallel mode `parallel` (under capture backend `graph`), or None; worded once, like
    quant_unsupported_reason. What a model itself refuses (heads the degree does not divide, MLA, linear attention)
    is said when it loads (pcg_core.distributed.tp_unsupported_reason)."""
    have = list(supported)
    if parallel in have:
        for kind in parse_parallel(parallel):
            if graph is not None and (limit := PARALLEL_GRAPH_LIMITS.get((kind, graph))):
                return f"parallel mode {parallel!r} under {graph}: {limit}"
        return None
    try:
        parts = parse_parallel(parallel)
    except ValueError as e:
        return str(e)
    alone = sum(n > 1 for n in parts.values()) == 1
    alone_words = {"pp": "pipeline parallelism", "dp": "data-parallel attention", "ep": "expert parallelism"}
    why = [f"{alone_words[k]} {parts[k]} is not run yet" if k in alone_words and alone else _NOT_YET[k]
           for k in parts if k in _NOT_YET and parts[k] > 1]
    tp = parts.get("tp", 1)
    if tp > 1 and f"tp{tp}" not in have:
        why.insert(0, f"tensor parallelism {tp} is not run yet")
    detail = "; ".join(why) or "not run by the runtime yet"
    return f"parallel mode {parallel!r} is not supported by the runtime yet ({detail}; supported: {', '.join(have)})"


def kv_cache_unsupported_reason(kv_cache: str, attention: str, backends: dict[str, Any] | None = None,
                                supported: Iterable[str] = KV_CACHE_DTYPES) -> str | None:
    """Why the runtime cannot store the KV cache as `kv_cache` under attention backend `attention`, or None: one
    wording for the matrix pre-check and a cell asked for directly."""
    if kv_cache == "auto":  # the model's dtype: every backend reads it
        return None
    have = list(supported)
    if kv_cache not in have:
        return f"kv_cache {kv_cache!r} is not supported by the runtime yet (supported: {', '.join(have)})"
    table = backends if backends is not None else capabilities()["attention_backends"]
    b = table.get(attention)
    if b is not None and (why := b.get("kv_cache", {}).get(kv_cache, f"it does not declare kv_cache {kv_cache}")):
        return why
    return None


def split_op_capture_reason(graph: str, features: Iterable[str], caps: dict[str, Any] | None = None) -> str | None:
    """Why capture backend `graph` cannot capture a model exercising `features` (model-card words) because a split op
    those features bring in is not capturable and `graph` records every op in its graph (`full`), or None. One
    wording for the matrix pre-check, `pcgh request` and the engine's refusal."""
    caps = caps if caps is not None else capabilities()
    backend = caps["capture_backends"].get(graph)
    if backend is None or not backend["requires_capturable_attention"]:
        return None
    feats = set(features)
    for name, op in caps.get("split_ops", {}).items():
        if op["feature"] in feats and not op["capturable"]:
            return f"capture backend {graph} records every op in one graph and {name} cannot be ({op['why_not_capturable']})"
    return None


def attention_unsupported_reason(attention: str, device: str, features: Iterable[str] = (),
                                 backends: dict[str, Any] | None = None) -> str | None:
    """Why attention backend `attention` cannot run a model exercising `features` (model-card words: those that
    are attention features count) on `device` (cpu, cuda, cuda:N), or None. One wording for the matrix pre-check
    (which passes its capabilities' table) and a cell asked for directly."""
    table = backends if backends is not None else capabilities()["attention_backends"]
    if attention not in table:
        return f"attention backend {attention!r} is not in the runtime (have: {', '.join(table)})"
    b = table[attention]
    if why := b.get("devices", {}).get(device.split(":")[0]):
        return why
    for f in features:
        if why := b.get("features", {}).get(f):
            return f"attention backend {attention!r} cannot run {f} ({why}); sdpa can"
    return None


def capabilities() -> dict[str, Any]:
    """Plain data (JSON-able). `capture_backends` maps each name, in registry order, to its declared needs."""
    attn = {}
    for name in attention_backend_names():
        cls = get_attention_backend(name)
        attn[name] = {
            "capturable": cls.capturable,
            "why_not_capturable": cls.why_not_capturable,
            "page_size": cls.page_size,
            # device type → None (runs there) or why not; feature → None (supported) or why not
            "devices": {d: cls.device_reason(d) for d in ("cpu", "cuda")},
            "features": cls.features(),
            # compute dtype → None (runs it) or why not
            "dtypes": {d: cls.dtype_reason(d) for d in DTYPES},
            # kv_cache dtype → None (it reads that cache) or why not
            "kv_cache": {kv: cls.kv_cache_reason(kv) for kv in KV_CACHE_DTYPES},
        }
    capture = {}
    for name in capture_backend_names():
        backend = cast(type[CaptureBackend], get_capture_backend(name))  # the registry returns a `type`
        capture[name] = {"requires_capturable_attention": backend.requires_capturable_attention}
    return {
        "architectures": {k: list(v) for k, v in architectures.SUPPORTED_ARCHITECTURES.items()},
        "model_type_aliases": dict(architectures.MODEL_TYPE_ALIASES),
        "attention_backends": attn,
        "capture_backends": capture,
        "split_ops": {name: dict(op) for name, op in SPLIT_OPS.items()},
        "compilers": list(COMPILERS),
        "dtypes": list(DTYPES),
        "quantization": list(QUANTIZATION),
        "quant_schemes": {s.name: {"description": s.description, "capturable": True, "aliases": list(s.aliases),
                                   "weights": s.weights, "activations": s.activations, "family": s.family,
                                   "needs": s.needs, "formats": list(s.formats), "layer": s.layer,
                                   "kernels": list(s.kernels), "checkpoint_limits": checkpoint_limits(s.name),
                                   **({"checkpoints": SCHEME_CHECKPOINTS[s.name]} if s.name in SCHEME_CHECKPOINTS else {})}
                          for s in quant_registry.SCHEME_INFO.values() if s.matrix},
        "quant_formats": list(QUANT_FORMATS),
        "kv_cache": dict(KV_CACHES),
        "parallel": dict(PARALLEL),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
