"""The VLM cases of the prompt suite and the runtime's verdicts on the VLM cards: image+text prompts of several
sizes packed with text-only ones, an image ending exactly at a bucket edge, and the cards no longer unsupported."""

from __future__ import annotations

import json

import pytest

from harness.cards import load_cards
from harness.cell.prompts import prompt_suite
from harness.request.analyze import analyze
from pcg_core.config import default_bucket_ladder
from pcg_core.model import build_config, shrink_config
from pcg_core.model.vision import text_token_limit

VLMS = ["qwen2.5-vl-7b", "qwen3-vl-30b-a3b"]


@pytest.fixture(scope="module", params=VLMS)
def tiny_config(request):
    return build_config(shrink_config(load_cards()[request.param].config, tiny=True))


def test_vision_cases_pack_images_with_text_and_end_one_at_a_bucket_edge(tiny_config):
    ladder = default_bucket_ladder(64)
    limit = text_token_limit(tiny_config)
    cases = prompt_suite(ladder, limit, max_new_tokens=4, model_config=tiny_config)
    vision = [c for c in cases if c.images is not None]
    assert [c.name.split("_")[1] for c in vision] == ["mixed", "edge"]
    assert cases[-1].name.startswith("repeat_")  # the stale-state repeat still comes last
    merge = tiny_config.vision_config.spatial_merge_size
    img_id = tiny_config.image_token_id
    mixed, edge = vision
    assert any(not imgs for imgs in mixed.images) and any(imgs for imgs in mixed.images)  # packed with text-only
    sizes = {im.grid_thw for imgs in mixed.images for im in imgs}
    assert len(sizes) >= 3  # several image sizes
    for prompt, imgs in zip(mixed.prompts + edge.prompts, mixed.images + edge.images):
        assert prompt.count(img_id) == sum(im.num_tokens(merge) for im in imgs)  # placeholders match the images
        text = [t for t in prompt if t not in (img_id, tiny_config.vision_start_token_id, tiny_config.vision_end_token_id)]
        assert all(0 <= t < limit for t in text)
    (prompt,), b = edge.prompts, edge.chunk
    assert b in ladder and prompt[b - 1] == img_id and prompt[b] == tiny_config.vision_end_token_id


def test_text_models_get_no_vision_cases():
    cases = prompt_suite(default_bucket_ladder(64), 1000, max_new_tokens=4)
    assert all(c.images is None for c in cases)


@pytest.mark.parametrize("card_id", VLMS)
def test_vlm_cards_are_supported_by_the_table_and_the_request_verdict(card_id):
    card = load_cards()[card_id]
    assert card.architecture_reason is None and card.runtime_reason is None
    report = analyze(json.loads(json.dumps(card.config)))
    assert report["verdicts"]["model"]["ok"] is True, report["verdicts"]["model"]
