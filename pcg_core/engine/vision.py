"""The eager pre-process of a vision-language model and the static buffers it fills for the captured text decoder.

A graph reads the addresses it saw at capture, and the VLM's front end is data-dependent (the vision tower over
per-image grids, the placeholder scatter, get_rope_index's per-image position runs, deepstack's boolean-mask add).
So it all runs eagerly, with transformers' own modules, once per sequence when prompts are packed (`prepare`),
and every forward copies what its rows need into buffers allocated once at the largest bucket (`fill`):

- `embeds[max_tokens, H]`: the token embedding, the image features on image placeholder rows; padding rows zero.
- `mrope[3, max_tokens]`: M-RoPE (t, h, w) positions: get_rope_index's for prompt rows; `position + rope_delta`
  for generated rows, the delta the sequence's own prefill computed (never the module's `rope_deltas`, which is
  one per model, not per sequence).
- `deepstack[L, max_tokens, H]` (Qwen3-VL): the deepstack features of the vision blocks, zero on every text and
  padding row, added densely after decoder layer l (pcg_core/model/vision.py: install_dense_deepstack).

The captured body reads the first T rows of each, so every bucket's graph finds its inputs at fixed addresses. A
batch above the largest bucket (eager only) gets fresh buffers for that forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pcg_core.engine.inputs import PackedBatch
from pcg_core.model.vision import Image, is_vlm

if TYPE_CHECKING:
    from transformers import PreTrainedModel

IMAGE_TYPE = 1  # transformers' mm_token_type_ids: text 0, image 1, video 2


@dataclass
class SequenceVision:
    """What one sequence's prefill computed: M-RoPE positions of its prompt [3, L], the feature row of each prompt
    position (-1: text) [L], its image features [k, H] and deepstack features [D, k, H] (D may be 0), its delta."""

    mrope: torch.Tensor
    feature_row: torch.Tensor
    embeds: torch.Tensor
    deepstack: torch.Tensor
    rope_delta: int


def vlm_model(model: torch.nn.Module) -> Any:
    """The VLM's inner model (transformers' Qwen2_5_VLModel / Qwen3VLMoeModel): visual, get_rope_index, language_model
    (read by name: those classes share no typed base that has them)."""
    inner = getattr(model, "model", model)
    if not hasattr(inner, "visual") or not hasattr(inner, "get_rope_index"):
        raise TypeError(f"{type(model).__name__}: not a Qwen-VL model (no .model.visual / get_rope_index)")
    return inner


def feature_rows(features: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """An image-feature output as one [rows, hidden] tensor, whichever form this transformers gives it in: split per
    image (a tuple of [rows_i, hidden]: pooler_output, and from 5.2x each deepstack layer) or whole ([rows, hidden]:
    deepstack layers in 5.17). `torch.cat(list(whole))` would flatten the latter to one row of rows × hidden."""
    if isinstance(features, torch.Tensor):
        if features.dim() != 2:
            raise ValueError(f"image features of shape {tuple(features.shape)}: expected [rows, hidden]")
        return features
    return torch.cat(list(features))


class VisionInputs:
    """The pre-process stage of a VLM and its static buffers (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, capacity: int, device: torch.device):
        self.vlm = vlm_model(model)
        self.config = model.config
        self.lm = self.vlm.language_model
        text = self.config.get_text_config()
        self.hidden = text.hidden_size
        self.dtype = self.lm.embed_tokens.weight.dtype
        self.device = device
        # Deepstack features feed the first D decoder layers (transformers: `layer_idx in range(len(...))`).
        self.ds_layers = min(len(getattr(self.config.vision_config, "deepstack_visual_indexes", None) or []),
                             text.num_hidden_layers)
        self.capacity = capacity
        self._static = self._alloc(capacity) if capacity > 0 else None
        self.embeds, self.mrope, self.deepstack = self._static or self._alloc(1)
        self.seqs: dict[int, SequenceVision] = {}
        self._rope_kwargs = set(inspect.signature(self.vlm.get_rope_index).parameters)

    @staticmethod
    def wanted(model: PreTrainedModel) -> bool:
        return is_vlm(model.config)

    def _alloc(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.zeros(n, self.hidden, dtype=self.dtype, device=self.device),
                torch.zeros(3, n, dtype=torch.int64, device=self.device),
                torch.zeros(self.ds_layers, n, self.hidden, dtype=self.dtype, device=self.device))

    # Per sequence, at prefill ----------------------------------------------------------------------------------
    @torch.no_grad()
    def prepare(self, prompts: Sequence[Sequence[int]], images: Sequence[Sequence[Image]] | None) -> None:
        """Run the vision tower and get_rope_index for each prompt with images (`images[i]`: prompt i's, in the
        order its placeholders appear); text-only prompts need nothing (delta 0). Replaces every earlier sequence."""
        if images is not None and len(images) != len(prompts):
            raise ValueError(f"images: one list per prompt ({len(prompts)} prompts), got {len(images)} lists")
        self.seqs = {}
        for i, prompt in enumerate(prompts):
            imgs = list(images[i]) if images is not None else []
            ids = torch.tensor(list(prompt), dtype=torch.int64, device=self.device)
            placeholders = ids == self.config.image_token_id
            if not imgs:
                if bool(placeholders.any()):
                    raise ValueError(f"prompt {i}: holds {int(placeholders.sum())} image placeholder token(s) "
                                     f"({self.config.image_token_id}) but no image was given; pass images[{i}]")
                continue
            self.seqs[i] = self._prepare_one(i, ids, placeholders, imgs)

    def _prepare_one(self, i: int, ids: torch.Tensor, placeholders: torch.Tensor, imgs: list[Image]) -> SequenceVision:
        vdtype = next(self.vlm.visual.parameters()).dtype
        pixels = torch.cat([im.pixel_values for im in imgs]).to(self.device, vdtype)
        grid = torch.tensor([im.grid_thw for im in imgs], dtype=torch.int64, device=self.device)
        out = self.vlm.get_image_features(pixels, grid, return_dict=True)
        embeds = feature_rows(out.pooler_output).to(self.dtype)
        if embeds.shape[0] != int(placeholders.sum()):
            raise ValueError(f"prompt {i}: {int(placeholders.sum())} image placeholder tokens but its "
                             f"{len(imgs)} image(s) give {embeds.shape[0]} features; build the prompt with "
                             "pcg_core.model.vision.image_tokens for each image, in order")
        feats = getattr(out, "deepstack_features", None) or []
        ds = [feature_rows(f).to(self.dtype) for f in feats][: self.ds_layers]
        deepstack = torch.stack(ds) if ds else embeds.new_zeros(0, *embeds.shape)
        kw = {"image_grid_thw": grid}
        if "mm_token_type_ids" in self._rope_kwargs:
            kw["mm_token_type_ids"] = (placeholders.int() * IMAGE_TYPE)[None]
        position_ids, deltas = self.vlm.get_rope_index(ids[None], **kw)
        row = torch.full_like(ids, -1)
        row[placeholders] = torch.arange(embeds.shape[0], device=self.device)
        # Positions and the row map on the host (fill indexes them per forward without a device sync); features on
        # the device.
        return SequenceVision(position_ids[:, 0].to(torch.int64).cpu(), row.cpu(), embeds, deepstack,
                              int(deltas.reshape(-1)[0]))

    def rope_delta(self, seq: int) -> int:
        """The M-RoPE delta of sequence `seq` (0 for text-only): generated position p runs at p + delta."""
        s = self.seqs.get(seq)
        return 0 if s is None else s.rope_delta

    # Per forward -------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def fill(self, batch: PackedBatch, num_tokens: int, input_ids: torch.Tensor) -> None:
        """Write the rows of `batch` (padded to num_tokens; input_ids the padded id buffer already filled)."""
        n = len(batch)
        bufs = self._static if self._static is not None and num_tokens <= self.capacity else self._alloc(num_tokens)
        self.embeds, self.mrope, self.deepstack = bufs
        embeds, mrope, deepstack = bufs[0][:num_tokens], bufs[1][:, :num_tokens], bufs[2][:, :num_tokens]
        embeds.zero_()
        mrope.zero_()
        deepstack.zero_()
        if n == 0:
            return
        embeds[:n] = self.lm.embed_tokens(input_ids[:n])
        seq = torch.tensor(batch.seq_ids, dtype=torch.int64)
        pos = torch.tensor(batch.positions, dtype=torch.int64)
        host = pos.expand(3, n).clone()
        for s, info in self.seqs.items():
            rows = seq == s
            if not bool(rows.any()):
                continue
            prompt_len = info.mrope.shape[1]
            in_prompt = rows & (pos < prompt_len)
            host[:, rows & ~in_prompt] += info.rope_delta  # generated tokens: position + this sequence's delta
            if bool(in_prompt.any()):
                host[:, in_prompt] = info.mrope[:, pos[in_prompt]]
                feature = info.feature_row[pos[in_prompt]]
                img = in_prompt.clone()
                img[in_prompt] = feature >= 0
                if bool(img.any()):
                    dst = img.nonzero()[:, 0].to(self.device)
                    src = feature[feature >= 0].to(self.device)
                    embeds[dst] = info.embeds[src]
                    if self.ds_layers:
                        deepstack[:, dst] = info.deepstack[:, src]
        mrope[:, :n].copy_(host.to(self.device, non_blocking=True))

    # The captured body ---------------------------------------------------------------------------------------
    def body(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The text decoder over the first T rows of the buffers: 4-row positions (text, t, h, w), as transformers'
        text model takes them, and the dense deepstack add where the model has one."""
        n = input_ids.shape[0]
        position_ids = torch.cat([positions[None], self.mrope[:, :n]])[:, None, :]
        kw = {}
        if self.ds_layers:
            kw = {"visual_pos_masks": None,
                  "deepstack_visual_embeds": [self.deepstack[layer, :n][None] for layer in range(self.ds_layers)]}
        out = self.lm(inputs_embeds=self.embeds[:n][None], position_ids=position_ids, use_cache=False, **kw)
        return out.last_hidden_state[0]
