"""producer_kv_scales (a producer's FP8 KV-cache calibration, for synthetic checkpoints) on the new architectures:
a VLM's text attention is recorded and its vision tower keeps its own attention implementation afterwards (before,
every sub-model was left on the text model's); Qwen3-Next runs transformers' own Gated DeltaNet (pcg's, over the
split op, needs the engine's forward context) and gets scales for its full-attention layers, whose K/V are cached."""

import torch

from harness.cards import find_card
from pcg_core.model import load_model
from pcg_core.model.qwen3_next import is_gated_deltanet
from pcg_core.quant import producer_kv_scales


def _tiny(card: str) -> torch.nn.Module:
    return load_model(find_card(card).config, tiny=True, dtype=torch.float32, device="cpu", seed=0).model


def _implementations(config) -> dict[str, str]:
    return {"": config._attn_implementation, **{k: getattr(config, k)._attn_implementation for k in config.sub_configs
                                               if getattr(config, k, None) is not None}}


def test_a_vlm_is_calibrated_in_its_text_model_and_its_vision_tower_keeps_sdpa():
    model = _tiny("qwen3-vl-30b-a3b")
    before = _implementations(model.config)
    assert before["vision_config"] == "sdpa" and before["text_config"] != "sdpa"
    scales = producer_kv_scales(model, torch.randint(0, 100, (1, 12)))
    assert sorted(scales) == [0, 1] and all(0 < k and 0 < v for k, v in scales.values())
    assert _implementations(model.config) == before


def test_qwen3_next_is_calibrated_on_its_full_attention_layers_with_pcgs_forward_put_back():
    model = _tiny("qwen3-next-80b-a3b")
    own = [m for m in model.modules() if is_gated_deltanet(m)]
    assert own and all("forward" in m.__dict__ for m in own)
    scales = producer_kv_scales(model, torch.randint(0, 100, (1, 12)))
    assert sorted(scales) == [1]  # layer 0 is a Gated DeltaNet layer
    assert all("forward" in m.__dict__ for m in own)
