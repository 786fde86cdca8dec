"""Analyze a model's raw config.json: architecture and runtime support, features, quantization, size, verdicts.

The config is data: `auto_map` (remote code) is never followed, and a model_type transformers does not know
is still analyzed field by field. Whether the runtime supports the model is the runtime's own call
(`pcg_core.model.unsupported_reason` on transformers' config, and `pcg_core.capabilities.capabilities()` for
the per-axis verdicts); nothing here keeps its own list.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from harness.request.features import detect
from harness.request.graph_memory import graph_memory, memory_note
from harness.request.quantization import quant_word, quantization_of
from harness.request.schema import RequestReport, config_hash
from harness.request.verdicts import (
    attention_verdict,
    graph_verdict,
    kv_cache_verdict,
    model_verdict,
    parallel_verdict,
    quant_verdict,
)
from harness.shape.params import (
    ParamCount,
    divides_heads,
    ep_sizes,
    h200s_needed,
    memory_bytes,
    tp_sizes,
)
from harness.shape.params import count as count_params
from harness.shape.structure import Structure, read_structure
from pcg_core.errors import ConfigError, UnsupportedModel
from pcg_core.quant import detect as detect_quantization
from pcg_core.quant.schemes import registry as quant_registry


def _loader_reading(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(scheme, None) for a quantized checkpoint the runtime's loader reads, (None, why) for one it refuses,
    (None, None) for none. ModelOpt's legacy hf_quant_config.json is not in a config.json, so not seen here."""
    try:
        spec = detect_quantization(config)
    except UnsupportedModel as e:
        return None, str(e).split(". Supported quantized formats")[0].removeprefix("config.json quantization_config: ")
    return (spec.scheme.name if spec else None), None


def _graph_memory(config: dict[str, Any], s: Any, tps: list[int] | None, tp_ok: list[int], features: list[str],
                  caps: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The graphs' memory at the TP size asked for, else at the smallest one that divides the heads and leaves room
    beside the weights in the checkpoint's own width; for the capture backends that can hold the model."""
    from pcg_core.capabilities import split_op_capture_reason

    scheme, _ = _loader_reading(config)
    width = quant_registry.info(scheme).weights if scheme else None
    graphs = [g for g, b in caps["capture_backends"].items()
              if g != "disabled" and split_op_capture_reason(g, features, caps) is None]
    return graph_memory(config, s, tps[:1] if tps else tp_ok, graphs, scheme, width, where)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers logs warnings while validating some configs; the report says what matters."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _transformers_class_names() -> set[str]:
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for attr in dir(modeling_auto):
        mapping = getattr(modeling_auto, attr)
        if attr.endswith("_MAPPING_NAMES") and isinstance(mapping, dict):
            for value in mapping.values():
                names.update([value] if isinstance(value, str) else [v for v in value if isinstance(v, str)])
    return names


def runtime_support(config: dict[str, Any], where: str) -> tuple[str, str | None, str | None]:
    """(architecture, reason it is unsupported or None, a note on a model_type/architecture mismatch)."""
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from pcg_core.model import build_config, unsupported_reason
    from pcg_core.model.architectures import architecture_of

    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"{where}: field architectures must be a list of class names, got {archs!r}; fix the config.json")
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"{where}: field model_type must be a string, got {model_type!r}; fix the config.json")
    if not archs and not model_type:
        raise ConfigError(f"{where}: has neither model_type nor architectures, so it names no model; pass the model's "
                          "transformers config.json (it has both), or its hub id")
    note = None
    try:
        with _quiet_transformers():  # a deep copy: transformers rewrites nested dicts (rope_scaling) in place
            built = build_config(copy.deepcopy(config), where=where)
        architecture = architecture_of(built)
        reason = unsupported_reason(built)
    except ConfigError as e:  # unknown model_type (UnsupportedModel), no model_type, or transformers rejects it
        architecture = archs[0] if archs else str(model_type)
        reason = str(e)
        also = unsupported_reason(PretrainedConfig(architectures=[architecture]))
        if also:
            reason = f"{reason}; besides, {also}"
    if archs and isinstance(model_type, str) and model_type in CONFIG_MAPPING and architecture not in _transformers_class_names():
        note = (f"transformers has no class {architecture}; model_type {model_type!r} names transformers' "
                f"{CONFIG_MAPPING[model_type].__name__}, a different model, so the config was read field by field")
    return architecture, reason, note


def _tp_reason(config: dict[str, Any], where: str) -> Callable[[int], str | None]:
    """Why the runtime's sharding cannot run the model at TP t (its plan, its attention kind), from transformers'
    config of it; called only for a model the runtime supports, whose config builds."""
    from pcg_core.distributed import tp_unsupported_reason
    from pcg_core.model import build_config

    with _quiet_transformers():
        built = build_config(copy.deepcopy(config), where=where)
    return lambda t: tp_unsupported_reason(built, t)


def analyze(config: dict[str, Any], *, model: str = "config", source: str = "config", revision: str | None = None,
            quants: list[str] | None = None, tps: list[int] | None = None, caps: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request report (schema.RequestReport) for one raw config.json mapping."""
    if not isinstance(config, dict):
        raise ConfigError(f"{model}: a config.json must hold a JSON object, found {type(config).__name__}; pass the model's config.json")
    if caps is None:
        from pcg_core.capabilities import capabilities

        caps = capabilities()
    where = model
    architecture, reason, mismatch = runtime_support(config, where)
    notes = _config_notes(config, mismatch, caps)
    s = read_structure(config, where)
    features, details = detect(config, s, architecture)
    quant = quantization_of(config)
    count = count_params(config, s, where)
    notes += _count_notes(count, s)
    size = _size(s, count, tps)
    quants = [quant_registry.canonical(q) for q in quants or []]  # fp4 is NVFP4's alias: the same verdict
    verdicts = _verdicts(config, where, architecture, reason, features, quant, quants, s, tps, size, caps)
    graphs = _graph_memory(config, s, tps, size.tp_ok, features, caps, where) if reason is None and size.total else None
    if graphs and (note := memory_note(graphs)):
        notes.append(note)
    dtype = s.f.data.get("torch_dtype") or s.f.data.get("dtype")
    report = RequestReport.model_validate({
        "model": model,
        "source": source,
        "revision": revision,
        "config_hash": config_hash(config),
        "model_type": config.get("model_type"),
        "architecture": architecture,
        "supported": reason is None,
        "reason": reason,
        "features": features,
        "feature_details": details,
        "quantization": quant,
        "dtype": str(dtype) if dtype else None,
        "params": size.total,
        "active_params": count.active if count else None,
        "non_embedding_params": count.non_embedding if count else None,
        "param_breakdown": count.breakdown if count else {},
        "memory_bytes": size.memory,
        "h200s": size.h200s,
        "graph_memory": graphs,
        "tp_sizes": size.tp_ok,
        "ep_sizes": size.ep_ok,
        "requested": {"quant": quants or None, "tp": tps or None},
        "verdicts": verdicts,
        "notes": notes,
    })
    return report.model_dump(exclude={"hub_id", "request_id", "requested_before", "duplicates", "card_id", "card", "submitted"})


def _config_notes(config: dict[str, Any], mismatch: str | None, caps: dict[str, Any]) -> list[str]:
    """What the report says about the config itself: remote code it never runs, a model_type naming another
    model, a model_type the runtime reads as an alias."""
    notes = []
    if isinstance(config.get("auto_map"), dict):
        notes.append(f"ships remote code (auto_map: {', '.join(sorted(config['auto_map']))}); pcg never runs it — "
                     "analyzed from the raw JSON")
    if mismatch:
        notes.append(mismatch)
    if (alias := caps.get("model_type_aliases", {}).get(config.get("model_type"))) is not None:
        notes.append(f"model_type {config['model_type']!r} is not a transformers type; the runtime reads it as {alias!r}, "
                     "the architecture it names, with transformers' own implementation")
    return notes


def _count_notes(count: ParamCount | None, s: Structure) -> list[str]:
    """Why the parameter count is missing, or what it leaves out."""
    notes = []
    if count is None:
        notes.append(f"no parameter count: the config lacks {', '.join(s.missing) or 'the widths'}")
    nextn = s.f.get_int("num_nextn_predict_layers", 0)
    if nextn:
        notes.append(f"num_nextn_predict_layers={nextn}: the multi-token-prediction layer(s) are not counted (transformers does not load them)")
    return notes


@dataclass(frozen=True)
class _Size:
    """The model's size and the parallel sizes it splits into, as the report and the parallel verdict read them:
    `divides` also holds the TP sizes asked for past 8 that divide the heads."""

    total: int | None
    tp_ok: list[int]
    divides: list[int]
    ep_ok: list[int]
    h200s: int | None
    memory: dict[str, int]


def _size(s: Structure, count: ParamCount | None, tps: list[int] | None) -> _Size:
    """The parallel sizes the heads and experts allow; the weights' bytes and H200s only when the parameters
    could be counted."""
    tp_ok = tp_sizes(s)
    divides = sorted(set(tp_ok) | {t for t in tps or [] if divides_heads(s, t)})
    ep_ok = ep_sizes(s)
    total = count.total if count else None
    h200s = h200s_needed(total) if total else None
    return _Size(total, tp_ok, divides, ep_ok, h200s, memory_bytes(total) if total else {})


def _verdicts(config: dict[str, Any], where: str, architecture: str, reason: str | None, features: list[str],
              quant: dict[str, Any] | None, quants: list[str], s: Structure, tps: list[int] | None, size: _Size,
              caps: dict[str, Any]) -> dict[str, Any]:
    """Each axis's verdict. The runtime's sharding rule is asked only for a model it supports: only then does
    transformers' config of it build."""
    wanted_quant = quants or [quant_word(quant)]
    return {
        "model": model_verdict(architecture, reason, features, caps),
        "quant": quant_verdict(wanted_quant, quant, caps, features, *_loader_reading(config)),
        "attention": attention_verdict(features, s.heads, s.kv_heads, caps),
        "parallel": parallel_verdict(tps or None, size.tp_ok, size.divides, size.ep_ok, size.h200s,
                                     size.memory.get("bfloat16"), s.moe.experts if s.moe else None, caps,
                                     _tp_reason(config, where) if reason is None else lambda t: None),
        "graph": graph_verdict(reason is None, caps, features),
        "kv_cache": kv_cache_verdict(quant, caps),
    }
