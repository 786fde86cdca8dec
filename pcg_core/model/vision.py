"""Vision-language models (Qwen2.5-VL, Qwen3-VL-MoE): what the loader, the trimmer and the prompt suite need to know
about them, and images to feed them.

pcg captures only the text decoder. The vision tower, the image-embedding merge, the M-RoPE index and Qwen3-VL's
deepstack features are data-dependent (per-image grids, `.tolist()` splits, boolean-mask scatters), so they run
eagerly before the captured forward (pcg_core/engine/vision.py) with transformers' own modules. An image here is
what the Qwen image processor would hand the model: flattened patches and a (t, h, w) patch grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Special tokens of a tiny VLM: the top of its vocabulary (below eos, which the trim clamps to vocab - 1), so that
# random text tokens drawn below `text_token_limit` never collide with them.
_TINY_SPECIAL = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")
# The vision tower at tiny widths: two blocks (one windowed, one full for Qwen2.5-VL; both feeding deepstack for
# Qwen3-VL), its own patch size, merge and temporal patch kept, so the token counts per image are the real ones.
TINY_VISION = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
# Pixel normalization of the Qwen image processors (CLIP's mean and std).
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


def is_vlm_config(data: dict[str, Any]) -> bool:
    """A config.json dict with a vision tower (Qwen2.5-VL, Qwen3-VL: `vision_config`)."""
    return isinstance(data.get("vision_config"), dict)


def is_vlm(config: Any) -> bool:
    """A built config (or a model's) with a vision tower the engine must run before the text decoder."""
    return getattr(config, "vision_config", None) is not None and getattr(config, "image_token_id", None) is not None


def scale_sections(sections: list[int], total: int) -> list[int]:
    """M-RoPE sections (t, h, w frequency counts summing to head_dim / 2) rescaled to sum to `total`, each ≥ 1,
    proportions kept (largest remainder): a tiny head_dim needs them to fit, or the rotary embedding fails."""
    whole = sum(sections)
    raw = [s * total / whole for s in sections]
    out = [max(1, int(r)) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    i = 0
    while sum(out) < total:
        out[order[i % len(out)]] += 1
        i += 1
    while sum(out) > total:
        j = max(range(len(out)), key=lambda k: out[k])
        out[j] -= 1
    return out


def shrink_vlm(d: dict[str, Any], shrink_text: Any, *, layers: int | None, tiny: bool) -> dict[str, Any]:
    """A VLM config dict trimmed: the text model through `shrink_text` (the loader's shrink_config, nested
    `text_config` or the flat Qwen2.5-VL layout alike), its M-RoPE sections refitted to a tiny head, and for tiny a
    small vision tower whose output width is the text model's; the special token ids moved inside a tiny vocabulary.
    The vision tower keeps all its blocks when only layers are trimmed (trim counts decoder layers)."""
    vision = dict(d["vision_config"])
    if isinstance(d.get("text_config"), dict):
        text = shrink_text(d["text_config"], layers=layers, tiny=tiny)
        d = {**d, "text_config": text}
    else:
        flat = {k: v for k, v in d.items() if k != "vision_config"}
        d = {**shrink_text(flat, layers=layers, tiny=tiny), "vision_config": vision}
        text = d
    if not tiny:
        return d
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list):
        half = (text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]) // 2
        text_rope = {**rope, "mrope_section": scale_sections(rope["mrope_section"], half)}
        text["rope_scaling" if "rope_scaling" in text else "rope_parameters"] = text_rope
    vision.update(TINY_VISION)
    vision["out_hidden_size"] = text["hidden_size"]
    depth = TINY_VISION["depth"]
    if isinstance(vision.get("fullatt_block_indexes"), list):  # Qwen2.5-VL: windowed blocks, the last one full
        vision["fullatt_block_indexes"] = [depth - 1]
    if isinstance(vision.get("deepstack_visual_indexes"), list):  # Qwen3-VL: deepstack from every block
        vision["deepstack_visual_indexes"] = list(range(min(depth, len(vision["deepstack_visual_indexes"]))))
    d["vision_config"] = vision
    vocab = text.get("vocab_size") or d.get("vocab_size")
    assert vocab is not None, "a VLM config without vocab_size"
    # Set whether the config names them or not: the config class's defaults are the real vocabulary's ids.
    for k, key in enumerate(_TINY_SPECIAL):
        d[key] = vocab - 1 - len(_TINY_SPECIAL) + k
    return d


def text_token_limit(config: Any) -> int:
    """Random text tokens are drawn below this: the vocabulary, or the lowest vision special token inside it (an
    image placeholder id in a text prompt would be taken for an image)."""
    vocab = config.get_text_config().vocab_size
    ids = [getattr(config, k, None) for k in (*_TINY_SPECIAL, "vision_token_id")]
    inside = [i for i in ids if isinstance(i, int) and 0 <= i < vocab]
    return min([vocab, *inside])


@dataclass(frozen=True)
class Image:
    """One image as the model takes it: `pixel_values` [patches, C·T·p·p] (normalized, patch-flattened in the
    processor's merge order) and its patch grid (t, h, w)."""

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]

    def num_tokens(self, merge: int) -> int:
        """Placeholder tokens the image takes in the prompt (after the patch merger)."""
        t, h, w = self.grid_thw
        return t * h * w // (merge * merge)


def synthetic_image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    """An RGB image [3, H, W] in [0, 1] that looks like one: a smooth two-colour gradient, a few soft blobs and a
    little sensor noise (flat noise would be a test pattern, not a picture)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.linspace(0, 1, height)[:, None]
    x = torch.linspace(0, 1, width)[None, :]
    a, b = torch.rand(3, generator=g), torch.rand(3, generator=g)
    img = a[:, None, None] * (1 - y) + b[:, None, None] * x
    for _ in range(3):
        cy, cx, r = torch.rand(3, generator=g)
        blob = torch.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (0.02 + 0.1 * float(r)))
        img = img + (torch.rand(3, generator=g)[:, None, None] - 0.5) * blob
    img = img + 0.02 * torch.randn(3, height, width, generator=g)
    return img.clamp(0, 1)


def patchify(image: torch.Tensor, vision_config: Any) -> Image:
    """An RGB image [3, H, W] (H, W multiples of patch·merge) as the Qwen image processor lays it out: normalized,
    the frame repeated to the temporal patch, cut into patches ordered by merge window (t, h/m, w/m, m, m), each
    flattened as (C, T, p, p)."""
    p, m, tp = vision_config.patch_size, vision_config.spatial_merge_size, vision_config.temporal_patch_size
    c, height, width = image.shape
    if height % (p * m) or width % (p * m):
        raise ValueError(f"image {height}x{width}: sides must be multiples of patch_size·merge = {p * m}; resize it first")
    mean, std = torch.tensor(IMAGE_MEAN)[:, None, None], torch.tensor(IMAGE_STD)[:, None, None]
    frames = ((image - mean) / std)[None].expand(tp, c, height, width)  # one image: its frame repeated in time
    gh, gw = height // p, width // p
    x = frames.reshape(1, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return Image(x.reshape(gh * gw, c * tp * p * p).contiguous(), (1, gh, gw))


def image_tokens(config: Any, image: Image) -> list[int]:
    """The prompt tokens that stand for `image`: vision start, one placeholder per merged patch, vision end."""
    merge = config.vision_config.spatial_merge_size
    return [config.vision_start_token_id, *[config.image_token_id] * image.num_tokens(merge), config.vision_end_token_id]


def _dense_deepstack(original: Any) -> Any:
    """Qwen3-VL's `_deepstack_process`, dense where pcg calls it: with no mask (the engine passes none) the features
    are a [1, T, H] buffer that is zero on text tokens, added to every row; a static-shape add a graph can hold,
    where transformers' boolean-mask scatter has a data-dependent shape. transformers' own call (with its mask) runs
    the original, so a reference forward on the same model is untouched."""

    def process(hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor | None,
                visual_embeds: torch.Tensor) -> torch.Tensor:
        if visual_pos_masks is None:
            return hidden_states + visual_embeds.to(hidden_states.dtype)
        return original(hidden_states, visual_pos_masks, visual_embeds)

    return process


def install_dense_deepstack(model: torch.nn.Module) -> None:
    """Give a Qwen3-VL text model the dense deepstack add (_dense_deepstack); other models are left alone."""
    for module in model.modules():
        if hasattr(module, "_deepstack_process") and not getattr(module, "_pcg_dense_deepstack", False):
            module._deepstack_process = _dense_deepstack(module._deepstack_process)
            setattr(module, "_pcg_dense_deepstack", True)
