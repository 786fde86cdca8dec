"""The paged KV cache: per layer a [slots + 1, kv_heads, head_dim] tensor for K and one for V, cut into pages (MLA
models: one latent tensor per layer, V a view of it).

A sequence reads whole pages (`page_size` slots each), not necessarily adjacent: its block table lists them in
order, and position p lives in slot `pages[p // page_size] * page_size + p % page_size`. Every slot also carries
its position and the sequence that wrote it (`slot_pos`, `slot_seq`), every page its first position and writer
(`page_pos`, `page_seq`), and `seq_pages[s, p]` says whether page p is in sequence s's block table: with the
positions, that is all a mask (sdpa), a block mask (flex) or a gather (varlen) needs. A page can be in several
block tables — a prefix cache's (engine/prefix_cache.py): a sequence that starts from another's cached prefix
reads that prefix's whole pages, written once, and writes only pages of its own (`allocate(..., shared=)`); a
page is freed when no sequence reads it and no prefix cache holds it. The extra last slot is the pad slot:
padded tokens write there and no sequence ever reads it; the extra last row of `seq_pages` is the padding rows'
(`reader_rows`), in no block table.

Slot-major, like vLLM's: K[:num_slots] viewed as [pages, page_size, heads, dim] is the page pool a paged
kernel takes, and one token's K for all heads is one contiguous row. Page 128 suits flex (its KV block), 1
gives the old one-slot-per-token cache.

`kv_cache="fp8_e4m3"` stores K and V as torch.float8_e4m3fn with a per-tensor scale per layer (x ≈ x_fp8 · scale;
MLA: one scale for the latent row, its values being a view of it), as serving engines' FP8 KV caches do. The
scales live in two float32 tensors allocated once (`k_scale`, `v_scale`, one entry per layer): every write and read
takes them as tensors, so a captured graph reads the scale of the moment it replays, never a number baked in at
capture (vLLM shipped that bug: a KV scale right in eager and stale under CUDA graphs). Writes saturate at ±448
(e4m3's largest finite value: its casts have no infinity); reads dequantize to the compute dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from transformers import PretrainedConfig

from pcg_core.errors import ConfigError
from pcg_core.known import KV_CACHE_DTYPES

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
KV_STORAGE = {"fp8_e4m3": torch.float8_e4m3fn}  # kv_cache value → stored dtype ("auto": the model's)

KVScales = Mapping[int, tuple[float, float]]  # decoder layer → (k_scale, v_scale)


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale in float32, saturated to ±448, as FP8 e4m3 (scale: a 0-d float32 tensor)."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FP8 codes times their scale, in float32, then in the compute dtype."""
    return (x.float() * scale).to(dtype)


class KVCacheFull(RuntimeError):
    """More slots were asked for than the cache holds; the message names `kv_slots`."""


class KVCache:
    def __init__(self, config: PretrainedConfig, num_slots: int, dtype: torch.dtype, device: torch.device,
                 page_size: int = 1, kv_cache: str = "auto", kv_heads: int | None = None):
        """kv_heads: the KV heads this process holds (a tensor-parallel rank: its share), default the config's."""
        if not isinstance(page_size, int) or page_size < 1:
            raise ConfigError(f"page_size must be a positive integer, got {page_size!r}", field="page_size")
        if kv_cache not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache {kv_cache!r} is unknown; choose one of {', '.join(KV_CACHE_DTYPES)}",
                              field="kv_cache")
        self.kv_cache = kv_cache
        self.dtype = dtype  # the compute dtype reads dequantize to
        self.quantized = kv_cache != "auto"
        store = KV_STORAGE.get(kv_cache, dtype)
        self.page_size = page_size
        self.num_pages = -(-num_slots // page_size)
        self.num_slots = self.num_pages * page_size  # whole pages
        self.pad_slot = self.num_slots
        layers = config.num_hidden_layers
        # A hybrid model's linear-attention layers (Qwen3-Next's Gated DeltaNet: 3 of 4) keep a recurrent state of
        # their own (pcg_core/linear_attention/state.py) and never touch this cache: K/V are allocated for the
        # attention layers only, the list still indexed by decoder layer (None at a linear layer).
        self.attention_layers = attention_layers(config)
        kept = set(self.attention_layers)
        # MLA (DeepSeek-V3, Kimi-K2): one latent row per token, the normed compressed KV then the rotated shared
        # key part; keys are the whole row (one KV head), values its first kv_lora_rank columns — a view, no copy.
        self.latent = bool(getattr(config, "kv_lora_rank", None))
        if self.latent:
            shape = (self.num_slots + 1, 1, config.kv_lora_rank + config.qk_rope_head_dim)
            self.k = [torch.zeros(shape, dtype=store, device=device) if i in kept else None for i in range(layers)]
            self.v = [None if k is None else k[..., :config.kv_lora_rank] for k in self.k]
        else:
            n_kv = kv_heads or getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            shape = (self.num_slots + 1, n_kv, head_dim)
            self.k = [torch.zeros(shape, dtype=store, device=device) if i in kept else None for i in range(layers)]
            self.v = [torch.zeros(shape, dtype=store, device=device) if i in kept else None for i in range(layers)]
        # Per-layer scales at fixed addresses (1 until set_scales: what a graph captured before them must not keep).
        self.k_scale = torch.ones(layers, dtype=torch.float32, device=device)
        self.v_scale = self.k_scale if self.latent else torch.ones(layers, dtype=torch.float32, device=device)
        self.slot_seq = torch.full((self.num_slots + 1,), -1, dtype=torch.int32, device=device)
        self.slot_pos = torch.zeros(self.num_slots + 1, dtype=torch.int64, device=device)
        self.page_seq = torch.full((self.num_pages,), -1, dtype=torch.int32, device=device)
        self.page_pos = torch.zeros(self.num_pages, dtype=torch.int64, device=device)
        # seq_pages[s, p]: page p is in sequence s's block table (one row per sequence id, ids < num_pages: a live
        # sequence writes at least one page of its own; the last row is the padding rows', always empty).
        self.seq_pages = torch.zeros(self.num_pages + 1, self.num_pages, dtype=torch.bool, device=device)
        self.block_tables: dict[int, list[int]] = {}  # sequence → its pages, in position order (host side)
        self._readers = [0] * self.num_pages  # how many block tables and prefix caches hold each page (host side)
        self._free: list[int] = list(range(self.num_pages))
        self.epoch = 0  # counts resets: a prefix cache's pages are valid in the epoch it saw them in

    # FP8 ------------------------------------------------------------------------------------------------------
    def set_scales(self, scales: KVScales) -> None:
        """Copy per-layer (k_scale, v_scale) into the scale tensors in place (their addresses stay, so graphs
        captured before see them). Every layer needs positive finite scales; a latent cache takes one per layer,
        so its k and v entries must be equal."""
        layers = len(self.k)
        check_kv_scales(scales, layers, self.latent, attention=self.attention_layers)
        got = {i: scales[i] for i in self.attention_layers}  # a linear-attention layer's scale is never read: 1
        k = torch.tensor([float(got[i][0]) if i in got else 1.0 for i in range(layers)], dtype=torch.float32)
        v = torch.tensor([float(got[i][1]) if i in got else 1.0 for i in range(layers)], dtype=torch.float32)
        self.k_scale.copy_(k)
        if not self.latent:
            self.v_scale.copy_(v)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store K and V rows in their slots, quantized with this layer's scales where the cache is FP8 (a latent
        cache stores K only: its V is a view of K's first columns, and so is the v it is handed)."""
        k_cache, v_cache = self._layer(layer)
        if not self.quantized:
            k_cache.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
            if not self.latent:
                v_cache.index_copy_(0, slot_mapping, v.to(v_cache.dtype))
            return
        # index_copy_ has no FP8 kernel on the CPU: the codes are copied as bytes.
        k_cache.view(torch.uint8).index_copy_(0, slot_mapping, quantize_kv(k, self.k_scale[layer]).view(torch.uint8))
        if not self.latent:
            v_cache.view(torch.uint8).index_copy_(0, slot_mapping, quantize_kv(v, self.v_scale[layer]).view(torch.uint8))

    def read(self, layer: int, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values, [S, Hkv, D] each, in the compute dtype: rows [:num_slots] (the pad slot
        left out), or the rows `index` lists. A 16-bit cache hands out its own tensors (views, or the rows
        selected); an FP8 one dequantizes them (one latent row dequantized once, values its first columns)."""
        k, v = self._layer(layer)
        if not self.quantized:
            if index is None:
                return k[: self.num_slots], v[: self.num_slots]
            return k.index_select(0, index), v.index_select(0, index)
        pick = (lambda t: t[: self.num_slots]) if index is None else \
            (lambda t: t.view(torch.uint8).index_select(0, index).view(t.dtype))
        keys = dequantize_kv(pick(k), self.k_scale[layer], self.dtype)
        if self.latent:
            return keys, keys[..., : v.shape[-1]]
        return keys, dequantize_kv(pick(v), self.v_scale[layer], self.dtype)

    def _layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.k[layer], self.v[layer]
        if k is None or v is None:  # v is None exactly where k is
            raise ValueError(f"layer {layer} is a linear-attention layer: it keeps a recurrent state, not a KV cache "
                             f"(the cache's attention layers: {list(self.attention_layers)})")
        return k, v

    def reset(self, page_order: list[int] | None = None) -> None:
        """Forget all sequences and prefix caches' pages (the tensors keep their addresses, so captured graphs stay
        valid). page_order: the order free pages are handed out in (tests scatter sequences over the pool with it)."""
        if page_order is not None and sorted(page_order) != list(range(self.num_pages)):
            raise ValueError(f"page_order must be a permutation of the {self.num_pages} pages")
        self.slot_seq.fill_(-1)
        self.slot_pos.zero_()
        self.page_seq.fill_(-1)
        self.page_pos.zero_()
        self.seq_pages.zero_()
        self.block_tables.clear()
        self._readers = [0] * self.num_pages
        self._free = list(page_order) if page_order is not None else list(range(self.num_pages))
        self.epoch += 1

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def allocate(self, seq_id: int, length: int, shared: list[int] | tuple[int, ...] = ()) -> list[int]:
        """Reserve pages for positions 0..length-1 of sequence `seq_id`; returns the slot of each position.
        shared: whole pages already written that hold its first len(shared) · page_size positions (a cached
        prefix); they join its block table read-only, and its own pages start after them."""
        if seq_id in self.block_tables:
            raise ValueError(f"sequence {seq_id} already holds pages")
        ps = self.page_size
        shared = list(shared)
        if len(shared) * ps > length or any(self._readers[p] == 0 for p in shared):
            raise ValueError(f"sequence {seq_id}: shared pages {shared} must be held (by a prefix cache or a live "
                             f"sequence) and cover at most its {length} positions")
        need = -(-length // ps) - len(shared)
        if need > len(self._free):
            used = self.num_pages - len(self._free)
            raise KVCacheFull(f"KV cache full: {used} of {self.num_pages} pages of {ps} slots used, "
                              f"{need} more asked for {length} tokens; raise kv_slots")
        if not isinstance(seq_id, int) or not 0 <= seq_id < self.num_pages:
            raise ValueError(f"sequence id {seq_id!r} out of range: ids index the block-table rows, 0 ≤ id < "
                             f"{self.num_pages} (the cache's pages: a live sequence writes one at least)")
        own, self._free = self._free[:need], self._free[need:]
        pages = shared + own
        self.block_tables[seq_id] = pages
        for p in pages:
            self._readers[p] += 1
        dev = self.slot_pos.device
        self.seq_pages[seq_id, torch.tensor(pages, dtype=torch.int64, device=dev)] = True
        if own:
            page_t = torch.tensor(own, dtype=torch.int64, device=dev)
            first = (torch.arange(need, dtype=torch.int64, device=dev) + len(shared)) * ps
            slots = (page_t[:, None] * ps + torch.arange(ps, device=dev)).flatten()
            # A page belongs to its sequence whole: slots past `length` in the last page carry the positions that
            # would follow, which no query of this sequence reaches (queries stay below `length`).
            self.slot_seq[slots] = seq_id
            self.slot_pos[slots] = (first[:, None] + torch.arange(ps, device=dev)).flatten()
            self.page_seq[page_t] = seq_id
            self.page_pos[page_t] = first
        return [pages[p // ps] * ps + p % ps for p in range(length)]

    def holders(self, page: int) -> int:
        """How many block tables and prefix caches hold `page` (0: free)."""
        return self._readers[page]

    def hold(self, page: int) -> None:
        """A prefix cache keeps `page` (and the KV its writer left in it) past the sequences that read it."""
        if self._readers[page] == 0:
            raise ValueError(f"page {page} is free: only a page a live sequence holds can be kept")
        self._readers[page] += 1

    def unhold(self, page: int) -> None:
        """A prefix cache lets `page` go (freed once no block table holds it either)."""
        self._drop(page)

    def release(self, seq_id: int) -> None:
        """Sequence `seq_id` is done: its block table goes, and each page no one else holds is free again."""
        pages = self.block_tables.pop(seq_id)
        self.seq_pages[seq_id].zero_()
        for p in pages:
            self._drop(p)

    def release_all(self) -> None:
        """Every live sequence released; pages a prefix cache holds stay."""
        for s in list(self.block_tables):
            self.release(s)

    def _drop(self, page: int) -> None:
        if self._readers[page] <= 0:
            raise ValueError(f"page {page} is not held")
        self._readers[page] -= 1
        if self._readers[page] == 0:
            self.page_seq[page] = -1
            self.slot_seq[page * self.page_size : (page + 1) * self.page_size] = -1
            self._free.append(page)

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """KV of slots `src` into slots `dst` in every layer, bit for bit (copy-on-write of a page a prefix ends
        inside: the copy's writer goes on from there in a page of its own)."""
        if not src:
            return
        dev = self.slot_pos.device
        s, d = torch.tensor(src, dtype=torch.int64, device=dev), torch.tensor(dst, dtype=torch.int64, device=dev)
        for k, v in zip(self.k, self.v):
            if k is None or v is None:  # v is None exactly where k is
                continue
            for t in (k,) if self.latent else (k, v):
                raw = t.view(torch.uint8) if self.quantized else t  # index_copy_ has no FP8 kernel on the CPU
                raw.index_copy_(0, d, raw.index_select(0, s))

    def reader_rows(self, seq_ids: torch.Tensor) -> torch.Tensor:
        """The `seq_pages` row of each token's sequence (padding, -2: the last row, which reads no page)."""
        return torch.where(seq_ids >= 0, seq_ids, self.num_pages).long()

    def readable(self, seq_ids: torch.Tensor) -> torch.Tensor:
        """[T, num_slots] bool: the slot is in a page of the token's sequence's block table."""
        rows = self.seq_pages.index_select(0, self.reader_rows(seq_ids))
        return rows.repeat_interleave(self.page_size, dim=1)

    @property
    def nbytes(self) -> int:
        tensors = self.k if self.latent else self.k + self.v  # a latent cache's values are views of its keys
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @property
    def bytes_per_token(self) -> int:
        """KV memory one token takes over all attention layers (MLA: (kv_lora_rank + qk_rope_head_dim) × layers ×
        dtype; a hybrid's linear-attention layers take none)."""
        return self.nbytes // (self.num_slots + 1)


def attention_layers(config: PretrainedConfig) -> tuple[int, ...]:
    """The decoder layers that attend over a KV cache: every layer, but a hybrid's `linear_attention` ones
    (config.layer_types, Qwen3-Next's)."""
    types = getattr(config, "layer_types", None)
    layers = config.num_hidden_layers
    if not isinstance(types, (list, tuple)):
        return tuple(range(layers))
    return tuple(i for i in range(layers) if i >= len(types) or types[i] != "linear_attention")


def check_kv_scales(scales: object, layers: int, latent: bool = False, where: str = "pcg_kv_scales",
                    attention: tuple[int, ...] | None = None) -> None:
    """ConfigError (field kv_cache) unless `scales` maps every attention layer (`attention`, default every decoder
    layer 0..layers-1) to two positive finite floats (equal ones for a latent cache); other layers (past a trimmed
    model's, or a hybrid's linear-attention ones) are allowed."""
    attention = tuple(range(layers)) if attention is None else attention
    fix = ("a dict {layer: (k_scale, v_scale)}, k ≈ k_fp8 · k_scale, from the checkpoint's k/v scales or "
           "pcg_core.engine.kv_scales.calibrate_kv_scales")
    if not isinstance(scales, Mapping):
        raise ConfigError(f"{where}: expected {fix}, got {type(scales).__name__}", field="kv_cache")
    bad_keys = [k for k in scales if not isinstance(k, int) or isinstance(k, bool) or k < 0]
    if bad_keys:
        raise ConfigError(f"{where}: layer keys must be non-negative ints, got {bad_keys[:3]!r}; expected {fix}",
                          field="kv_cache")
    missing = [i for i in attention if i not in scales]
    if missing:
        raise ConfigError(f"{where}: no KV scales for layer(s) {missing[:8]} of {layers}; expected {fix}", field="kv_cache")
    for i in attention:
        pair = scales[i]
        try:
            ks, vs = (float(x) for x in pair)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}[{i}]: expected (k_scale, v_scale), got {pair!r}", field="kv_cache") from None
        if not all(math.isfinite(x) and x > 0 for x in (ks, vs)):
            raise ConfigError(f"{where}[{i}]: KV scales must be positive and finite, got ({ks!r}, {vs!r})",
                              field="kv_cache")
        if latent and ks != vs:
            raise ConfigError(f"{where}[{i}]: a latent (MLA) cache has one scale per layer, got k {ks!r} ≠ v {vs!r}",
                              field="kv_cache")
