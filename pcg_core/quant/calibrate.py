"""Static activation scales for synthetic checkpoints: record each linear layer's input absmax while the caller
runs calibration forwards, as a producer (ModelOpt, llm-compressor) calibrates before exporting."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pcg_core.quant.layers.experts import intermediate_absmax, is_experts, quantizable


@contextmanager
def record_input_absmax(model: torch.nn.Module) -> Iterator[dict[str, float]]:
    """Yields {linear name: largest |input| seen} filled by the forwards run inside the block; for a fused MoE
    experts module, "<name>.gate_up" and "<name>.down" (its two projections' inputs over the routed tokens)."""
    seen: dict[str, float] = {}
    handles = []

    def keep(key: str, value: float) -> None:
        seen[key] = max(seen.get(key, 0.0), value)

    for name, mod in model.named_modules():
        if type(mod) is torch.nn.Linear:
            def hook(_mod, args, _out, name=name):
                keep(name, float(args[0].detach().abs().max()))
            handles.append(mod.register_forward_hook(hook))
        elif is_experts(mod) and quantizable(mod):  # the others are refused by quantize_experts
            def experts_hook(mod, args, kwargs, _out, name=name):
                names = ("hidden_states", "top_k_index", "top_k_weights")
                x, idx = (args[i] if len(args) > i else kwargs[names[i]] for i in range(2))
                keep(f"{name}.gate_up", float(x.detach().abs().max()))
                keep(f"{name}.down", intermediate_absmax(mod, x.detach(), idx))
            handles.append(mod.register_forward_hook(experts_hook, with_kwargs=True))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()
