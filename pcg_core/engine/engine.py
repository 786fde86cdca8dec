"""The engine: packs prompts into one ragged batch, pads it to a bucket, runs the capture backend, turns
hidden states into logits and logprobs, and decodes greedily.

prompts → PackedBatch → InputBuffers (pad, metadata) → forward context → capture backend → lm_head rows →
logprobs → per-prompt outputs. Data flows one way; the capture backend never sees prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple
from collections.abc import Callable

import torch

from pcg_core.attention import KVCache, get_attention_backend
from pcg_core.attention.kv_cache import KVCacheFull
from pcg_core.attention.metadata import AttentionMetadata, FreshPath
from pcg_core.attention.fresh import FRESH_PATH_MAX_SEQS, FRESH_PATH_MIN_TOKENS
from pcg_core.capture import make_capture_backend
from pcg_core.capture.stats import CaptureStats
from pcg_core.config import EngineConfig
from pcg_core.engine.inputs import InputBuffers, PackedBatch
from pcg_core.engine.kv_scales import kv_scales_of
from pcg_core.engine.prefix_cache import PrefixCache, PrefixMatch
from pcg_core.engine.prep import PrepGraphs
from pcg_core.engine.schedule import Forward, Schedule
from pcg_core.engine.vision import VisionInputs
from pcg_core.distributed.data_parallel import DataParallel, data_parallel_of
from pcg_core.distributed.shard import tensor_parallel_of
from pcg_core.errors import ConfigError
from pcg_core.model.mla import mla_installed
from pcg_core.model.vision import Image
from pcg_core.forward_context import (AttentionObserver, AttentionProbe, CaptureMode, ForwardContext,
                                      set_forward_context)
from pcg_core.linear_attention.setup import make_linear_state

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LOGITS_CHUNK = 1024  # rows of lm_head at a time, so prompt logprobs over long prompts stay small
HEAD_SLICE_BYTES = 256 << 20  # float32 head weight upcast at a time: DeepSeek-V3's whole head would be 3.7 GB

# Told of every forward: (batch, the bucket it was padded to or None, whether it ran the graph path, whether it
# is a decode step). The judge counts coverage with it; the engine itself keeps no record of batches.
ForwardListener = Callable[["PackedBatch", "int | None", bool, bool], None]


@dataclass
class SequenceOutput:
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)  # logprob of each chosen token
    output_topk_ids: list[list[int]] = field(default_factory=list)
    output_topk_logprobs: list[list[float]] = field(default_factory=list)
    # Filled when prompt logprobs are asked for: prompt_logprobs[i] is log p(prompt[i+1] | prompt[:i+1]);
    # the top-k lists cover every prompt position.
    prompt_logprobs: list[float] | None = None
    prompt_topk_ids: list[list[int]] | None = None
    prompt_topk_logprobs: list[list[float]] | None = None
    # Prompt tokens taken from a prefix cache, not computed: the prompt lists above then start at this position
    # (prompt_logprobs[j] is log p(prompt[cached+j+1] | prompt[:cached+j+1])).
    cached_tokens: int = 0


class Packed(NamedTuple):
    """A packed prefill: the batch of the tokens to compute, each sequence's slots by position (its decode tokens go to
    seq_slots[i][position]), and how many of each prompt's first tokens came from a prefix cache instead."""

    batch: PackedBatch
    seq_slots: list[list[int]]
    cached: list[int]


@dataclass
class _RowStats:
    chosen: torch.Tensor  # [R] logprob of the given target token (or of the argmax)
    argmax: torch.Tensor  # [R]
    topk_ids: torch.Tensor  # [R, k]
    topk_lp: torch.Tensor  # [R, k]


def head_logits(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits of hidden states. A plain linear head runs in float32: in bf16 the logits' own rounding
    (2^-5 at |logit| ≥ 4, 2^-4 at ≥ 8) is as large as the logprob tolerance and would drown what the
    judge compares; the hidden states themselves stay as the model made them. The head is upcast a vocabulary
    slice at a time (HEAD_SLICE_BYTES), so the transient stays small beside a big model's weights."""
    if hidden.dtype == torch.float32 or type(head) is not torch.nn.Linear:
        return head(hidden).float()
    x, weight = hidden.float(), head.weight
    rows = max(1, HEAD_SLICE_BYTES // (4 * weight.shape[1]))
    out = torch.empty(*hidden.shape[:-1], weight.shape[0], dtype=torch.float32, device=hidden.device)
    for v in range(0, weight.shape[0], rows):  # a float32 copy of a slice of the head at a time, not all of it
        bias = None if head.bias is None else head.bias[v : v + rows].float()
        out[..., v : v + rows] = torch.nn.functional.linear(x, weight[v : v + rows].float(), bias)
    return out


class Engine:
    def __init__(self, model: PreTrainedModel, config: EngineConfig):
        self.model = model
        self.config = config
        self.device = config.torch_device
        attn_cls = get_attention_backend(config.attention)
        if reason := attn_cls.device_reason(self.device.type):
            raise ConfigError(reason, field="attention")
        self.cache = KVCache(model.config.get_text_config(), config.kv_slots, config.torch_dtype, self.device,
                             page_size=config.page_size or attn_cls.page_size, kv_cache=config.kv_cache,
                             kv_heads=tp.kv_heads if (tp := tensor_parallel_of(model)) is not None else None)
        scales = kv_scales_of(model, self.cache) if self.cache.quantized else None  # refused before any capture
        self.attn_backend = attn_cls(self.cache, config.capture.max_tokens)
        # None unless the model has linear layers
        self.linear_state = make_linear_state(model.config, config, tp.group.size if tp is not None else 1)
        # The smallest forward that takes the split ops' fresh-sequence paths (None: neither the model nor the
        # attention backend has one, or the paths are off); graphs that record split ops get a variant from it up.
        mla = mla_installed(model)
        fresh_min = FRESH_PATH_MIN_TOKENS if mla or attn_cls.fresh_path else None
        self.inputs = InputBuffers(config.capture.max_tokens, self.cache, self.device,
                                   fresh_bounds=mla and fresh_min is not None)
        # A VLM: its vision front end runs eagerly into static buffers the captured text decoder reads.
        self.vision = VisionInputs(model, config.capture.max_tokens, self.device) if VisionInputs.wanted(model) else None
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.on_forward: ForwardListener | None = None
        # The capture backend (self.attn_backend is attention's); it also checks the backend name.
        self.backend = make_capture_backend(config.capture, self._body, self.device, self._dummy_inputs, self.attn_backend)
        self.backend.fresh_min = fresh_min
        # MLA's op takes a dense kernel for a forward of one sequence ("one"); varlen's own-rows read is one path
        self.backend.fresh_paths = () if fresh_min is None else ("packed", "one") if mla else ("packed",)
        self.prep = PrepGraphs(self.inputs, self.attn_backend, self.device)
        with torch.inference_mode(False), torch.no_grad():
            self.backend.prepare()
            if self.backend.pads:
                self.prep.capture(list(config.capture.ladder), PackedBatch([], [], [], []))
        if scales is not None:
            # Loaded after capture, on purpose: graphs must read the scale tensors, and a graph that kept the value
            # it saw at capture (1) then differs from eager in every cell, not only after a recalibration.
            self.cache.set_scales(scales)

    @property
    def stats(self) -> CaptureStats:
        return self.backend.stats

    # Forward ----------------------------------------------------------------------------------------------
    def _body(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.vision is not None:
            return self.vision.body(input_ids, positions)
        out = self.decoder(input_ids=input_ids.unsqueeze(0), position_ids=positions.unsqueeze(0), use_cache=False)
        return out.last_hidden_state[0]

    def _dummy_inputs(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        input_ids, positions, md = self.inputs.fill(PackedBatch([], [], [], []), num_tokens)
        if self.vision is not None:
            self.vision.fill(PackedBatch([], [], [], []), num_tokens, input_ids)
        self.attn_backend.begin_forward(md)
        if self.linear_state is not None:
            assert md.host_seq_ids is not None and md.host_positions is not None  # InputBuffers.fill sets them
            self.linear_state.begin_forward(md.host_seq_ids, md.host_positions)
        return input_ids, positions, ForwardContext(md, self.attn_backend, bucket=num_tokens, linear_state=self.linear_state)

    def bucket_for(self, num_tokens: int) -> int | None:
        """The bucket a batch of num_tokens is padded to (None: it runs unpadded, eagerly)."""
        return self.config.capture.bucket_for(num_tokens) if self.backend.pads else None

    @torch.no_grad()
    def forward(self, batch: PackedBatch, eager: bool = False, observer: AttentionObserver | None = None,
                decode: bool = False, pad_to: int | None = None, probe: AttentionProbe | None = None) -> torch.Tensor:
        """Hidden states [len(batch), hidden] of a packed batch whose KV slots are allocated.

        eager=True pads exactly as the graph path would but runs the model eagerly: the reference for
        "replay is bitwise equal to eager at the same padded token count". observer(layer, query) sees every
        attention input that runs outside a graph (eager, holes), for naming the first diverging piece. decode
        only tells the listener what kind of step this is. pad_to (with eager) pads to another engine's bucket: an
        eager reference at the graph's padding, on this engine's own cache. probe (eager only) is called after
        each attention call with the backend and the call's tensors (forward_context.AttentionProbe).
        """
        if (dp := data_parallel_of(self.model)) is not None:
            return self._data_parallel_forward(dp, batch, eager, observer, decode, pad_to, probe)
        n = len(batch)
        bucket = pad_to if eager and pad_to is not None else self.bucket_for(n)
        return self._forward(batch, bucket, eager, observer, decode, probe)[:n]

    def _forward(self, batch: PackedBatch, bucket: int | None, eager: bool, observer: AttentionObserver | None,
                 decode: bool, probe: AttentionProbe | None) -> torch.Tensor:
        """One forward of `batch` padded to `bucket` (None: unpadded); replays where a bucket is and eager is not.
        Returns every row, padding included."""
        replay = bucket is not None and not eager
        if self.backend.pads and not eager:
            if bucket is None:
                self.stats.eager_fallbacks += 1
            else:
                self.stats.bucket_hits[bucket] += 1
        if self.on_forward is not None:
            self.on_forward(batch, bucket, replay, decode)
        input_ids, positions, md = self.stage_inputs(batch, bucket or len(batch), replay)
        mode = CaptureMode.REPLAY if replay else CaptureMode.EAGER
        ctx = ForwardContext(md, self.attn_backend, bucket=bucket, mode=mode, observer=observer,
                             attention_probe=probe if eager else None, linear_state=self.linear_state)
        with set_forward_context(ctx):
            return self.backend.run(input_ids, positions, ctx) if replay else self._body(input_ids, positions)

    def _data_parallel_forward(self, dp: DataParallel, batch: PackedBatch, eager: bool,
                               observer: AttentionObserver | None, decode: bool, pad_to: int | None,
                               probe: AttentionProbe | None) -> torch.Tensor:
        """This rank's sequences of `batch`, padded to the bucket of the largest local count over the ranks (to that
        count itself where the whole batch is past the ladder, or eager without pad_to: the least padding every rank
        can share), then the ranks' rows gathered back into the whole batch. pad_to (eager) only asks for the
        graph's padding: the graph's bucket is the agreed count's, which each rank's engine works out alike."""
        rows = dp.split(batch.seq_ids)
        mine = rows[dp.group.rank]
        local = PackedBatch([batch.token_ids[i] for i in mine], [batch.positions[i] for i in mine],
                            [batch.seq_ids[i] for i in mine], [batch.slots[i] for i in mine])
        widest = dp.agreed_rows(len(local), self.device)
        # Replays where the whole batch fits the ladder (an eager reference is asked for the graph's padding then,
        # and for none past it: both sides then pad alike); else eager, padded to the agreed count.
        graphed = pad_to is not None if eager else self.bucket_for(len(batch)) is not None
        bucket = self.bucket_for(widest) if graphed else None
        if bucket is None and not eager and self.backend.pads:
            self.stats.eager_fallbacks += 1
        hidden = self._forward(local, bucket or widest, eager or bucket is None, observer, decode, probe)
        return dp.gather(hidden[: bucket or widest], rows)

    def fresh_path(self, seq_ids: torch.Tensor, positions: torch.Tensor, num_tokens: int) -> FreshPath:
        """The split ops' fresh-sequence path (AttentionMetadata.fresh_path) a forward of these rows (host tensors,
        packed by sequence) padded to `num_tokens` takes: one where the model or attention backend has them, the
        forward is at least `fresh_min` wide, holds at most FRESH_PATH_MAX_SEQS sequences, and every sequence in it
        starts at position 0 (nothing of it cached: not a decode step, a later chunk or a prefix hit) — "one" for a
        single sequence where the backend distinguishes it, else "packed". A function of the rows and the padding
        alone, so an eager reference at a graph's padding decides alike."""
        low = self.backend.fresh_min
        if low is None or num_tokens < low or not len(seq_ids):
            return ""
        starts = torch.ones(len(seq_ids), dtype=torch.bool)
        starts[1:] = seq_ids[1:] != seq_ids[:-1]
        count = int(starts.sum())
        if count > FRESH_PATH_MAX_SEQS or bool(positions[starts].any()):
            return ""
        return "one" if count == 1 and "one" in self.backend.fresh_paths else "packed"

    def stage_inputs(self, batch: PackedBatch, num_tokens: int, replay: bool) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The batch into the input buffers and the attention metadata built: a replay takes the bucket's prep
        graph where there is one (one launch), anything else the eager upload and begin_forward. A VLM's front
        end (embeddings, M-RoPE rows, deepstack) then fills its own static buffers from the uploaded ids."""
        staged = self.inputs.stage(batch, num_tokens)
        md = staged.md
        assert md.host_seq_ids is not None and md.host_positions is not None  # InputBuffers.stage sets them
        md.fresh_path = self.fresh_path(md.host_seq_ids, md.host_positions, num_tokens)
        if not (replay and self.prep.replay(staged)):
            self.inputs.upload(staged)
            self.inputs.mark_uploaded()
            self.attn_backend.begin_forward(md)
        if self.vision is not None:
            self.vision.fill(batch, num_tokens, staged.input_ids)
        if self.linear_state is not None:  # the recurrent layers' state slots for this batch (host side)
            self.linear_state.begin_forward(md.host_seq_ids, md.host_positions)
        return staged.input_ids, md.positions, md

    def prefill_batch(self, prompts: list[list[int]], extra_slots: int = 0,
                      images: Sequence[Sequence[Image]] | None = None) -> PackedBatch:
        """Reset the cache, allocate slots for `prompts` (+ extra per sequence) and pack them into one batch."""
        return self.pack_prompts(prompts, extra_slots, images).batch

    def pack_prompts(self, prompts: list[list[int]], extra_slots: int, images: Sequence[Sequence[Image]] | None = None,
                     prefix_cache: PrefixCache | None = None) -> Packed:
        """Every earlier sequence dropped, slots allocated for `prompts` (+ extra per sequence) and the prompts packed
        into one batch. images[i]: prompt i's images (a VLM: its vision front end runs here, once per sequence).
        prefix_cache: each prompt starts from its longest cached prefix (those tokens are not in the batch); the
        cache's pages are all that outlives the earlier sequences."""
        if self.vision is not None:
            self.vision.prepare(prompts, images)
        elif images is not None and any(images):
            raise ValueError(f"{type(self.model).__name__} takes no images (it has no vision tower); drop `images`")
        if prefix_cache is None:
            self.cache.reset()
        else:
            self._check_prefix_cache(prefix_cache, images)
            self.cache.release_all()
        if self.linear_state is not None:
            self.linear_state.reset()
        packed = Packed(PackedBatch([], [], [], []), [], [])
        ps = self.cache.page_size
        for i, p in enumerate(prompts):
            match = prefix_cache.match(p) if prefix_cache is not None else PrefixMatch(page_size=ps)
            slots = self._allocate(i, len(p) + extra_slots, match, prefix_cache)
            start = len(match.shared) * ps
            if match.copied:  # the page the prefix ends inside: its first positions copied into this sequence's own
                assert match.copy_page is not None  # PrefixMatch: a page to copy from whenever copied > 0
                self.cache.copy_slots([match.copy_page * ps + j for j in range(match.copied)],
                                      slots[start : start + match.copied])
            if self.linear_state is not None:
                self.linear_state.allocate(i)
            done = match.length
            packed.seq_slots.append(slots)
            packed.cached.append(done)
            packed.batch.token_ids.extend(p[done:])
            packed.batch.positions.extend(range(done, len(p)))
            packed.batch.seq_ids.extend([i] * (len(p) - done))
            packed.batch.slots.extend(slots[done : len(p)])
        return packed

    def _allocate(self, seq: int, length: int, match: PrefixMatch, prefix_cache: PrefixCache | None) -> list[int]:
        """KVCache.allocate, a prefix cache's least recently used pages let go first where the cache is full."""
        try:
            return self.cache.allocate(seq, length, match.shared)
        except KVCacheFull:
            if prefix_cache is None:
                raise
            need = -(-length // self.cache.page_size) - len(match.shared) - self.cache.free_pages
            prefix_cache.evict(need, keep={*match.shared} if match.copy_page is None else {*match.shared, match.copy_page})
            return self.cache.allocate(seq, length, match.shared)

    def _check_prefix_cache(self, prefix_cache: PrefixCache, images: Sequence[Sequence[Image]] | None) -> None:
        """What a prefix cache cannot serve, refused by name."""
        if prefix_cache.cache is not self.cache:
            raise ValueError("prefix_cache belongs to another engine's KV cache; make one with PrefixCache(engine.cache)")
        if self.linear_state is not None:
            raise ValueError(f"{type(self.model).__name__} has linear-attention layers: starting from a cached prefix needs "
                             "their recurrent state at the prefix's end, which pcg does not keep per prefix; run it "
                             "without prefix_cache")
        if data_parallel_of(self.model) is not None:
            raise ValueError("a data-parallel model keeps each rank's sequences in that rank's KV cache, so one rank's "
                             "cached prefix is not another's; run it without prefix_cache")
        if images is not None and any(images):
            raise ValueError("a prefix cache keys pages by token ids, and an image's placeholder tokens are alike for "
                             "every image; run prompts with images without prefix_cache")

    def remember(self, prefix_cache: PrefixCache, sequences: list[list[int]]) -> None:
        """The packed sequences' pages into `prefix_cache`: sequences[i] the tokens whose KV sequence i wrote (its
        prompt, then every generated token it was fed)."""
        for i, tokens in enumerate(sequences):
            prefix_cache.insert(tokens, self.cache.block_tables[i])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of hidden states (head_logits)."""
        return head_logits(self.lm_head, hidden)

    def _row_stats(self, hidden: torch.Tensor, targets: torch.Tensor | None, top_k: int) -> _RowStats:
        """Per row: the logprob of its target token (of its argmax where the target is None or -1), the argmax and
        the top k."""
        parts = []
        for s in range(0, hidden.shape[0], LOGITS_CHUNK):
            logits = self.logits(hidden[s : s + LOGITS_CHUNK])
            lp = torch.log_softmax(logits, dim=-1)
            argmax = lp.argmax(dim=-1)
            tgt = argmax if targets is None else torch.where(targets[s : s + LOGITS_CHUNK] >= 0,
                                                              targets[s : s + LOGITS_CHUNK], argmax)
            chosen = lp.gather(1, tgt[:, None])[:, 0]
            topk = lp.topk(min(top_k, lp.shape[-1]), dim=-1)
            parts.append((chosen, argmax, topk.indices, topk.values))
        cat = [torch.cat(p).cpu() for p in zip(*parts)]
        return _RowStats(*cat)

    # Generation -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_new_tokens: int | Sequence[int] = 8, top_k: int = 5,
        prompt_logprobs: bool = False, chunk: int | None = None, images: Sequence[Sequence[Image]] | None = None,
        prefix_cache: PrefixCache | None = None, join_at: Sequence[int] | None = None,
    ) -> list[SequenceOutput]:
        """Prefill the prompts as one packed batch, then decode greedily, every unfinished sequence per step
        (schedule.py walks the forwards).

        max_new_tokens: one count for all, or one per sequence (sequences then leave the decode batch at
        different steps, as they do in a server). chunk: prefill in forwards of at most that many tokens, each
        attending to the KV the earlier ones wrote (chunked prefill: positions run past the chunk size). images: a
        VLM's images, one list per prompt (pcg_core.model.vision: patchify, image_tokens). prefix_cache: each prompt
        starts from its longest prefix cached there (SequenceOutput.cached_tokens), and the sequences' pages go into
        it at the end, for the next call. join_at[i]: the decode step prompt i joins at (0: the first prefill),
        packed after that step's decode rows (continuous batching).
        """
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        new = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(new) != len(prompts) or any(n < 1 for n in new):
            raise ValueError("max_new_tokens must be ≥ 1, one count for all prompts or one per prompt")
        if chunk is not None and chunk < 1:
            raise ValueError("chunk must be ≥ 1")
        batch, seq_slots, cached = self.pack_prompts(prompts, max(new), images, prefix_cache)
        outs = [SequenceOutput(prompt_ids=list(p), cached_tokens=c) for p, c in zip(prompts, cached)]
        if prompt_logprobs:
            for o in outs:
                o.prompt_logprobs, o.prompt_topk_ids, o.prompt_topk_logprobs = [], [], []
        schedule = Schedule(batch, prompts, cached, seq_slots, new, chunk, join_at)
        while (fwd := schedule.next()) is not None:
            hidden = self.forward(fwd.batch, decode=fwd.decode)
            schedule.advance(self._take(outs, fwd, hidden, top_k, prompt_logprobs))
        if prefix_cache is not None:
            self.remember(prefix_cache, schedule.fed())
        return outs

    def _take(self, outs: list[SequenceOutput], fwd: Forward, hidden: torch.Tensor, top_k: int,
              prompt_logprobs: bool) -> list[int]:
        """One forward's rows into the outputs: prompt rows' logprobs (where asked), each emit row's greedy token;
        returns those tokens, in emit order."""
        if prompt_logprobs:  # every row of the forward: prompt rows scored on their next prompt token
            targets = torch.full((len(fwd.batch),), -1, dtype=torch.int64)
            targets[fwd.prompt_rows] = torch.tensor(fwd.targets, dtype=torch.int64)
            rows = self._row_stats(hidden, targets.to(hidden.device), top_k)
            ids, lps, chosen = rows.topk_ids.tolist(), rows.topk_lp.tolist(), rows.chosen.tolist()  # once per forward
            for r, t in zip(fwd.prompt_rows, fwd.targets):
                o = outs[fwd.batch.seq_ids[r]]
                assert o.prompt_topk_ids is not None and o.prompt_topk_logprobs is not None and o.prompt_logprobs is not None
                o.prompt_topk_ids.append(ids[r])
                o.prompt_topk_logprobs.append(lps[r])
                if t >= 0:
                    o.prompt_logprobs.append(chosen[r])
            pick = torch.tensor(fwd.emit_rows, dtype=torch.int64)
            step = _RowStats(rows.chosen[pick], rows.argmax[pick], rows.topk_ids[pick], rows.topk_lp[pick])
        elif not fwd.emit_rows:  # a prefill chunk in which no prompt ends
            return []
        else:
            step = self._row_stats(hidden[torch.tensor(fwd.emit_rows, device=hidden.device)], None, top_k)
        self._append(outs, step, fwd.emit_seqs)
        return step.argmax.tolist()

    @staticmethod
    def _append(outs: list[SequenceOutput], step: _RowStats, rows_of: list[int]) -> None:
        """Row r of `step` belongs to sequence rows_of[r]."""
        for r, i in enumerate(rows_of):
            o = outs[i]
            o.output_ids.append(int(step.argmax[r]))
            o.output_logprobs.append(float(step.chosen[r]))
            o.output_topk_ids.append(step.topk_ids[r].tolist())
            o.output_topk_logprobs.append(step.topk_lp[r].tolist())
