"""Static activation scales for synthetic checkpoints: record each linear layer's input absmax while the caller
runs calibration forwards, as a producer (ModelOpt, llm-compressor) calibrates before exporting."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from pcg_core.quant.layers.experts import intermediate_absmax, is_experts, quantizable

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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


_KV_CALIBRATION = "pcg_kv_calibration"


def _attention_settings(config) -> tuple[str | dict, str | dict]:
    """(the model's attention implementations as they are, the calibration's): a VLM's recorded in its text model
    only and every sub-model's restored as it was (its vision tower keeps its own, SDPA), in the dict form
    set_attn_implementation takes; a text model's as one name."""
    subs = [k for k in getattr(config, "sub_configs", None) or {} if getattr(config, k, None) is not None]
    if "text_config" not in subs:
        return config._attn_implementation, _KV_CALIBRATION
    previous = {"": config._attn_implementation, **{k: getattr(config, k)._attn_implementation for k in subs}}
    return previous, {**previous, "": _KV_CALIBRATION, "text_config": _KV_CALIBRATION}


def producer_kv_scales(model: PreTrainedModel, input_ids: torch.Tensor) -> dict[int, tuple[float, float]]:
    """{decoder layer index: (k_scale, v_scale)}, each the absmax of what that layer's KV cache holds over a forward
    of `input_ids` [1, T], divided by FP8 e4m3's 448: a producer's FP8 KV-cache calibration (ModelOpt's, without
    its clamp to ≥ 1, so the scales vary by layer as a mix-up needs them to). The keys are taken after the norm and
    the rotary embedding, as cached; an MLA layer's one scale covers its latent row [normed c, rotated k_rot]
    (a rotation moves each (x, y) pair on its circle, so the rope part is bounded by its pairs' norms). For writing
    synthetic checkpoints below the engine; a cell calibrates through pcg's own cache (engine/kv_scales.py)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from pcg_core.quant.formats.kv_scales import FP8_E4M3_MAX, attention_modules

    seen: dict[int, list[float]] = {}

    def keep(idx: int, k: float, v: float) -> None:
        old = seen.setdefault(idx, [0.0, 0.0])
        old[0], old[1] = max(old[0], k), max(old[1], v)

    def recording(module, query, key, value, attention_mask, **kwargs):
        if not hasattr(module, "kv_lora_rank"):  # MLA: the latent, from the hooks below
            keep(module.layer_idx, float(key.detach().abs().max()), float(value.detach().abs().max()))
        kwargs.pop("s_aux", None)  # gpt-oss's sinks: the scores' normalizer, not what the cache holds
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(_KV_CALIBRATION, recording)
    handles = []
    # pcg's own forwards, installed per instance (MLA's absorbed one, Qwen3-Next's Gated DeltaNet over the split op),
    # run inside pcg's engine only: transformers' own run here.
    own = {mod: mod.__dict__.pop("forward") for mod in model.modules() if "forward" in mod.__dict__}
    for idx, (name, mla) in attention_modules(model).items():
        if not mla:
            continue
        mod = model.get_submodule(name)
        rank = mod.kv_lora_rank

        def latent(_m, _a, out, idx=idx):
            keep(idx, float(out.detach().abs().max()), 0.0)

        def rope_part(_m, _a, out, idx=idx, rank=rank):
            r = out[..., rank:].detach().float()
            half = r.shape[-1] // 2
            pairs = torch.cat([torch.hypot(r[..., :half], r[..., half:]), torch.hypot(r[..., 0::2], r[..., 1::2])], -1)
            keep(idx, float(pairs.max()), 0.0)
        handles += [mod.get_submodule("kv_a_layernorm").register_forward_hook(latent),
                    mod.get_submodule("kv_a_proj_with_mqa").register_forward_hook(rope_part)]
    previous, recording_one = _attention_settings(model.config)
    try:
        model.set_attn_implementation(recording_one)
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
        for h in handles:
            h.remove()
        for mod, forward in own.items():
            mod.forward = forward
    return {idx: (k / FP8_E4M3_MAX, (v or k) / FP8_E4M3_MAX) for idx, (k, v) in sorted(seen.items())}
