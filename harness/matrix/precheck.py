"""Capability pre-check: decide before launch which cells the runtime cannot run, with the reason.

Everything is read from `pcg_core.capabilities()` and the model cards — no list is kept here. The runtime's
table is imported when a cell is first checked, not with this module: loading and selecting a matrix (its names,
filters, tiers) costs no torch, so a typo is an error before the seconds the runtime takes to import.
"""

from __future__ import annotations

from typing import Any

from harness.cards import ModelCard, find_card
from harness.matrix.expand import Cell
from harness.outcome import ModelRef
from pcg_core.errors import ConfigError
from pcg_core.known import world_size


def precheck(cell: Cell, caps: dict[str, Any], cards: dict[str, ModelCard | None]) -> str | None:
    """Why the runtime cannot run `cell`, or None. The card and its variant were checked when the matrix loaded;
    `cards` caches the cards across the cells of a plan (and their architecture verdict with them)."""
    from pcg_core.capabilities import (attention_unsupported_reason, kv_cache_unsupported_reason,
                                       parallel_unsupported_reason, quant_unsupported_reason, split_op_capture_reason)

    a = cell.axes
    if a.get("engine", "pcg") == "sglang":  # SGLang's own kernels and model code: pcg's capabilities say nothing
        from harness.sglang.precheck import sglang_reason

        return sglang_reason(cell.spec, cell.ranks, caps["cuda_devices"])
    card_id = ModelRef.parse(a["model"]).card
    if card_id not in cards:
        cards[card_id] = find_card(card_id)
    card = cards[card_id]
    if card is None:
        raise ConfigError(f"no model card {card_id!r} in harness/models/ (load_matrix refuses such a matrix)")
    if reason := card.runtime_reason:
        return reason
    limits = caps.get("quant_schemes", {}).get(a["quant"], {}).get("checkpoint_limits", {})
    if reason := quant_unsupported_reason(a["quant"], caps["quantization"], card.features, cell.spec.weights == "real",
                                          limits):
        return reason
    if cell.spec.weights == "real" and (reason := card.no_checkpoint_reason(a["quant"]) or card.checkpoint_reason(a["quant"])):
        return reason
    if reason := attention_unsupported_reason(a["attention"], cell.spec.device, card.features, caps["attention_backends"]):
        return reason
    if reason := kv_cache_unsupported_reason(a.get("kv_cache", "auto"), a["attention"], caps["attention_backends"],
                                             caps.get("kv_cache", {})):
        return reason
    if a["graph"] not in caps["capture_backends"]:
        return f"capture backend {a['graph']!r} is not in the runtime (have: {', '.join(caps['capture_backends'])})"
    attn = caps["attention_backends"][a["attention"]]
    if caps["capture_backends"][a["graph"]]["requires_capturable_attention"] and not attn["capturable"]:
        return (f"capture backend {a['graph']} needs a capturable attention backend; "
                f"{a['attention']} is not ({attn['why_not_capturable']})")
    if reason := split_op_capture_reason(a["graph"], card.features, caps):
        return reason
    if reason := parallel_unsupported_reason(a["parallel"], caps["parallel"], a["graph"]):
        return reason
    try:
        ranks = world_size(a["parallel"])
    except ValueError as e:
        return str(e)
    if cell.spec.device.startswith("cuda") and caps["cuda_devices"] < ranks:
        return (f"{needs_gpus(ranks)} ({a['parallel']}: one per rank, on one host), {caps['cuda_devices']} "
                f"{caps.get('gpu_host', 'visible on this machine')}")
    if cell.spec.device.startswith("cuda") and caps.get("cuda_memory_bytes") and not cell.spec.tiny:
        return memory_fit_reason(cell, card, caps["cuda_memory_bytes"])
    return None


def memory_fit_reason(cell: Cell, card: ModelCard, gpu_bytes: int) -> str | None:
    """`needs N GPUs` when the cell's weights + KV + graphs per GPU (fit.py's estimate, divided as its parallel
    mode divides them) are over `gpu_bytes`, the memory of one of this host's GPUs; None when it fits."""
    from harness.matrix.fit import fit_reason, trimmed
    from pcg_core.quant.schemes import registry as quant_registry

    spec = cell.spec
    quant = quant_registry.canonical(spec.quant)
    width: str | None
    try:
        width = None if quant == "none" else quant_registry.info(quant).weights
    except (KeyError, ValueError, ConfigError):
        width = quant  # an umbrella word (fp8, int8, int4) is its own width
    return fit_reason(trimmed(card.config, spec.layers), spec.parallel, spec.dtype or "bfloat16", width,
                      spec.resolved_max_tokens, spec.kv_cache, gpu_bytes, where=f"card {card.id}")


def needs_gpus(n: int) -> str:
    """The words a cell refused for lack of GPUs starts its reason with (reports group refusals by them)."""
    return f"needs {n} GPU{'s' if n != 1 else ''}"
