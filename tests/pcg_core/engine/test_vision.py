"""VLMs (Qwen2.5-VL, Qwen3-VL-MoE) at tiny widths: pcg's eager pre-process + text decoder matches transformers' own
forward with images (prefill and decode, so the rope delta is exercised), a packed batch gives each sequence what it
gets alone, every graph backend matches eager, and planted faults in the vision path are caught."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml
from pcg_helpers import CONFIGS, make_engine

from pcg_core.engine.vision import VisionInputs
from pcg_core.model.loader import load_model, shrink_config
from pcg_core.model.vision import (
    image_tokens,
    patchify,
    scale_sections,
    synthetic_image,
    text_token_limit,
)

CARDS = CONFIGS.parent
VLMS = ["qwen2.5-vl-7b", "qwen3-vl-30b-a3b"]
NEW = 4
TOL = 1e-4  # float32: pcg's op vs transformers' eager attention differ by ~3e-6


def card_config(name: str) -> dict:
    cfg = yaml.safe_load((CARDS / f"{name}.yaml").read_text())["config"]
    return json.loads((CARDS / cfg).read_text()) if isinstance(cfg, str) else cfg


@pytest.fixture(scope="module", params=VLMS)
def vlm(request):
    return load_model(card_config(request.param), tiny=True)


def image_for(config, rows: int, cols: int, seed: int):
    """An image of rows × cols merged tokens."""
    side = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    return patchify(synthetic_image(rows * side, cols * side, seed=seed), config.vision_config)


def vl_prompts(config):
    """An image+text prompt (text, image, text), a text-only one, and one of two images of other sizes."""
    g = torch.Generator().manual_seed(0)
    lim = text_token_limit(config)

    def text(n):
        return torch.randint(0, lim, (n,), generator=g).tolist()

    a, b, c = image_for(config, 2, 3, 1), image_for(config, 3, 2, 2), image_for(config, 1, 2, 3)
    prompts = [text(5) + image_tokens(config, a) + text(4), text(9),
               text(2) + image_tokens(config, b) + text(3) + image_tokens(config, c) + text(2)]
    return prompts, [[a], [], [b, c]]


def reference_logprobs(lm, prompt, images, out) -> torch.Tensor:
    """transformers' own model (eager attention and experts) on prompt + generated tokens, teacher-forced: the
    logprob of each next token, prompt positions then the decode steps (M-RoPE from its own get_rope_index)."""
    from transformers import AutoModelForImageTextToText

    kw = {"experts_implementation": "eager"} if lm.config.get_text_config().model_type.endswith("moe_text") else {}
    ref = AutoModelForImageTextToText.from_config(copy.deepcopy(lm.config), attn_implementation="eager",
                                                  dtype=lm.model.dtype, **kw).eval()
    ref.load_state_dict(lm.model.state_dict())
    full = list(prompt) + out.output_ids[:-1]
    ids = torch.tensor([full])
    kwargs = {}
    if images:
        kwargs = {"pixel_values": torch.cat([im.pixel_values for im in images]),
                  "image_grid_thw": torch.tensor([im.grid_thw for im in images]),
                  "mm_token_type_ids": (ids == lm.config.image_token_id).int()}
    with torch.no_grad():
        lp = torch.log_softmax(ref(input_ids=ids, use_cache=False, **kwargs).logits[0].float(), -1)
    targets = torch.tensor(full[1:] + [out.output_ids[-1]])
    return lp.gather(1, targets[:, None])[:, 0]


def ours(out) -> torch.Tensor:
    return torch.tensor(out.prompt_logprobs + out.output_logprobs)


def test_eager_matches_transformers_with_images(vlm):
    prompts, images = vl_prompts(vlm.config)
    outs = make_engine(vlm.model, "disabled").generate(prompts, NEW, prompt_logprobs=True, images=images)
    for p, imgs, o in zip(prompts, images, outs):
        diff = (reference_logprobs(vlm, p, imgs, o) - ours(o)).abs().max().item()
        assert diff < TOL, f"prompt of {len(p)} tokens, {len(imgs)} image(s): {diff}"


def test_packed_batch_equals_alone(vlm):
    prompts, images = vl_prompts(vlm.config)
    engine = make_engine(vlm.model, "disabled")
    packed = engine.generate(prompts, NEW, prompt_logprobs=True, images=images)
    for i, (p, imgs) in enumerate(zip(prompts, images)):
        alone = engine.generate([p], NEW, prompt_logprobs=True, images=[imgs])[0]
        assert alone.output_ids == packed[i].output_ids
        assert (ours(alone) - ours(packed[i])).abs().max().item() < 1e-5


@pytest.mark.parametrize("backend", ["piecewise", "breakable", "full"])
def test_graph_backends_match_eager(vlm, backend):
    prompts, images = vl_prompts(vlm.config)
    eager = make_engine(vlm.model, "disabled", max_tokens=32).generate(prompts, NEW, prompt_logprobs=True, images=images)
    graph = make_engine(vlm.model, backend, max_tokens=32).generate(prompts, NEW, prompt_logprobs=True, images=images)
    for e, g in zip(eager, graph):
        assert e.output_ids == g.output_ids
        assert (ours(e) - ours(g)).abs().max().item() < 1e-4


def test_planted_stale_rope_delta_is_caught(vlm, monkeypatch):
    """Decode rows given the delta of the module's last prefill (transformers' one-per-model `rope_deltas`) or none:
    the teacher-forced reference on the image prompt disagrees from the first decode step."""
    prompts, images = vl_prompts(vlm.config)
    orig_prepare = VisionInputs._prepare_one

    def stale(self, *args):
        info = orig_prepare(self, *args)
        info.rope_delta = 0  # the fault: decode positions without this sequence's delta
        return info

    monkeypatch.setattr(VisionInputs, "_prepare_one", stale)
    outs = make_engine(vlm.model, "disabled").generate(prompts[:1], NEW, prompt_logprobs=True, images=images[:1])
    ref = reference_logprobs(vlm, prompts[0], images[0], outs[0])
    n = len(prompts[0]) - 1
    assert (ref[:n] - ours(outs[0])[:n]).abs().max().item() < TOL  # the prefill is still right
    assert (ref[n:] - ours(outs[0])[n:]).abs().max().item() > 10 * TOL


def test_planted_deepstack_on_text_rows_is_caught(vlm, monkeypatch):
    """Deepstack features spread onto text rows (a buffer not zeroed there): text-only prompts packed beside an
    image prompt no longer get what they get alone. Qwen2.5-VL has no deepstack: nothing to plant."""
    engine = make_engine(vlm.model, "disabled")
    if engine.vision.ds_layers == 0:
        pytest.skip("no deepstack in this model")
    prompts, images = vl_prompts(vlm.config)
    alone = engine.generate([prompts[1]], NEW, prompt_logprobs=True)[0]
    orig_fill = VisionInputs.fill

    def leaky(self, batch, num_tokens, input_ids):
        orig_fill(self, batch, num_tokens, input_ids)
        ds = self.deepstack[:, : len(batch)]
        image_rows = ds.abs().sum((0, 2)) > 0
        if bool(image_rows.any()):
            ds[:, ~image_rows] = ds[:, image_rows].mean(1, keepdim=True)  # the fault: features on text rows

    monkeypatch.setattr(VisionInputs, "fill", leaky)
    packed = engine.generate(prompts, NEW, prompt_logprobs=True, images=images)[1]
    assert (ours(alone) - ours(packed)).abs().max().item() > 1e-3


def test_deepstack_reaches_the_decoder(vlm, monkeypatch):
    """The dense deepstack add changes image-prompt outputs (zeroing the features moves them): the path is live."""
    engine = make_engine(vlm.model, "disabled")
    if engine.vision.ds_layers == 0:
        pytest.skip("no deepstack in this model")
    prompts, images = vl_prompts(vlm.config)
    base = engine.generate(prompts[:1], 1, prompt_logprobs=True, images=images[:1])[0]
    orig = VisionInputs._prepare_one

    def without_deepstack(self, *args):
        info = orig(self, *args)
        info.deepstack.zero_()
        return info

    monkeypatch.setattr(VisionInputs, "_prepare_one", without_deepstack)
    without = engine.generate(prompts[:1], 1, prompt_logprobs=True, images=images[:1])[0]
    assert (ours(base) - ours(without)).abs().max().item() > 1e-3


def test_image_placeholders_must_match_images(vlm):
    prompts, images = vl_prompts(vlm.config)
    engine = make_engine(vlm.model, "disabled")
    with pytest.raises(ValueError, match="no image was given"):
        engine.generate(prompts[:1], 1)
    with pytest.raises(ValueError, match="image placeholder tokens"):
        engine.generate(prompts[:1], 1, images=[images[2]])


def test_trim_nested_configs():
    q3 = shrink_config(card_config("qwen3-vl-30b-a3b"), layers=3)
    assert q3["text_config"]["num_hidden_layers"] == 3 and q3["vision_config"]["depth"] == 27
    tiny = shrink_config(card_config("qwen3-vl-30b-a3b"), tiny=True)
    t, v = tiny["text_config"], tiny["vision_config"]
    assert t["num_hidden_layers"] == 2 and t["hidden_size"] == 64 and v["out_hidden_size"] == 64
    assert sum(t["rope_scaling"]["mrope_section"]) == t["head_dim"] // 2
    assert max(v["deepstack_visual_indexes"]) < v["depth"]
    assert all(tiny[k] < t["vocab_size"] for k in ("image_token_id", "vision_start_token_id", "video_token_id"))
    q25 = shrink_config(card_config("qwen2.5-vl-7b"), tiny=True)
    assert q25["num_hidden_layers"] == 2 and q25["vision_config"]["fullatt_block_indexes"] == [1]
    assert scale_sections([16, 24, 24], 8) == [2, 3, 3] and sum(scale_sections([24, 20, 20], 8)) == 8


def test_quantization_leaves_the_vision_tower_16bit():
    """A quantized VLM cell quantizes the text decoder's linears and experts, never the vision tower (its real
    checkpoints keep it 16-bit); the eager forward with images still runs."""
    from pcg_core.quant import get_scheme, quantize_model

    lm = load_model(card_config("qwen3-vl-30b-a3b"), tiny=True)
    names = quantize_model(lm.model, get_scheme("int8_w8a8"))
    assert names and all(n.startswith("model.language_model.") for n in names)
    assert any(type(m) is torch.nn.Linear for m in lm.model.model.visual.modules())
    prompts, images = vl_prompts(lm.config)
    out = make_engine(lm.model, "disabled").generate(prompts[:1], 2, images=images[:1])[0]
    assert len(out.output_ids) == 2


def test_chunked_prefill_splits_an_image_across_forwards(vlm):
    """An image cut by the chunk edge (features and M-RoPE positions looked up by sequence and position, not by
    forward) gives what one unchunked prefill gives."""
    prompts, images = vl_prompts(vlm.config)
    engine = make_engine(vlm.model, "disabled")
    whole = engine.generate(prompts, NEW, prompt_logprobs=True, images=images)
    chunked = engine.generate(prompts, NEW, prompt_logprobs=True, images=images, chunk=7)
    for w, c in zip(whole, chunked):
        assert w.output_ids == c.output_ids
        assert (ours(w) - ours(c)).abs().max().item() < 1e-5


def test_image_features_as_transformers_5_17_returns_them_give_the_same_outputs(vlm, monkeypatch):
    """transformers 5.17 hands each deepstack layer back whole ([rows, hidden]) where 5.2x splits it per image; both
    must reach the decoder as the same rows (seen on the H200: Qwen3-VL-MoE failed every cell on 5.17)."""
    engine = make_engine(vlm.model, "disabled")
    prompts, images = vl_prompts(vlm.config)
    split = engine.generate(prompts, NEW, prompt_logprobs=True, images=images)
    from pcg_core.engine.vision import vlm_model

    inner = type(vlm_model(vlm.model))
    orig = inner.get_image_features

    def whole(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        if getattr(out, "deepstack_features", None):
            out.deepstack_features = [torch.cat(list(f)) for f in out.deepstack_features]
        return out

    monkeypatch.setattr(inner, "get_image_features", whole)
    engine = make_engine(vlm.model, "disabled")
    for a, b in zip(split, engine.generate(prompts, NEW, prompt_logprobs=True, images=images)):
        assert a.output_ids == b.output_ids
        assert (ours(a) - ours(b)).abs().max().item() == 0


def test_feature_rows_takes_split_and_whole_features_and_refuses_other_shapes():
    from pcg_core.engine.vision import feature_rows

    x = torch.arange(12.0).reshape(6, 2)
    assert torch.equal(feature_rows(x), x) and torch.equal(feature_rows(x.split([2, 4])), x)
    with pytest.raises(ValueError, match=r"expected \[rows, hidden\]"):
        feature_rows(x.reshape(2, 3, 2))
