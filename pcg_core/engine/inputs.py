"""Static input buffers: token ids, positions and attention metadata, allocated once at the largest bucket.

The attention backend's own metadata (a mask, a block mask, cu_seqlens) is its business: the engine calls its
`begin_forward` after the upload, or replays both from a prep graph (engine/prep.py).

A forward padded to bucket b uses the first b rows of each buffer, so a graph captured for b finds its inputs
at the same addresses on every replay. A batch above the largest bucket gets fresh tensors (it runs eagerly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pcg_core.attention.fresh import FRESH_PATH_MAX_SEQS, sequence_bounds
from pcg_core.attention.metadata import AttentionMetadata
from pcg_core.attention.kv_cache import KVCache

PAD_SEQ = -2  # sequence id of padding rows: matches no slot (free slots carry -1)


@dataclass
class PackedBatch:
    """A ragged batch on the host: tokens of many sequences back to back."""

    token_ids: list[int]
    positions: list[int]
    seq_ids: list[int]
    slots: list[int]

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class StagedBatch:
    """A batch written to the host staging rows, not yet uploaded: its metadata (device views, filled by upload)."""

    md: AttentionMetadata
    input_ids: torch.Tensor  # [T] int64 device view
    rows: torch.Tensor  # [4, T] int64 device view: input_ids, positions, slot_mapping, seq_ids
    host: torch.Tensor  # [4, T] int64 host rows (a view of the pinned staging buffer, or fresh for an oversize batch)


class InputBuffers:
    """The engine's static input buffers, and the one way a batch gets into them.

    A batch is written into a pinned host staging buffer (`stage`, host work only), then copied to the device (four
    row copies) and unpacked there (`upload`, device work only). Split so that a graph can hold `upload` (and the
    attention metadata built from it) for a bucket: the forward's host work is then the staging write and one
    replay (engine/prep.py). A copy from pinned memory is asynchronous, so `stage` first waits until the previous
    upload has read the staging buffer (`uploaded`, an event recorded after each upload or replay).
    """

    def __init__(self, capacity: int, cache: KVCache, device: torch.device, fresh_bounds: bool = False):
        """fresh_bounds: the upload also builds the sequences' cu_seqlens (AttentionMetadata.fresh_bounds), once per
        forward instead of once per layer, for a model whose split ops take a fresh path over them (MLA, the path on)."""
        self.capacity = capacity
        self.cache = cache
        self.device = device
        self.fresh_bounds = fresh_bounds
        cuda = device.type == "cuda"
        self._host = torch.zeros(4, max(capacity, 1), dtype=torch.int64, pin_memory=cuda)
        self._dev = self._alloc(capacity) if capacity > 0 else None
        self.uploaded = torch.cuda.Event() if cuda else None

    def _alloc(self, n: int) -> dict[str, torch.Tensor]:
        d = self.device
        bufs = {
            "rows": torch.zeros(4, n, dtype=torch.int64, device=d),  # input_ids, positions, slot_mapping, seq_ids
            "seq_ids": torch.zeros(n, dtype=torch.int32, device=d),
            "valid": torch.zeros(n, dtype=torch.bool, device=d),
        }
        if self.fresh_bounds:
            bufs["bounds"] = torch.zeros(FRESH_PATH_MAX_SEQS + 2, dtype=torch.int32, device=d)
        return bufs

    def stage(self, batch: PackedBatch, num_tokens: int) -> StagedBatch:
        """Write `batch` padded to `num_tokens` rows into the staging buffer (host only); the metadata's device
        views are filled by `upload`."""
        n = len(batch)
        if num_tokens < n:
            raise ValueError(f"cannot pad {n} tokens down to {num_tokens}")
        pad = num_tokens - n
        host = torch.tensor(
            [
                batch.token_ids + [0] * pad,
                batch.positions + [0] * pad,
                batch.slots + [self.cache.pad_slot] * pad,
                batch.seq_ids + [PAD_SEQ] * pad,
            ],
            dtype=torch.int64,
        )
        if num_tokens <= self.capacity:
            if self.uploaded is not None:
                self.uploaded.synchronize()  # the last upload has read the staging rows overwritten here
            src = self._host[:, :num_tokens]
            src.copy_(host)
            assert self._dev is not None  # allocated when capacity > 0; num_tokens ≥ 1
            bufs = self._dev
        else:  # above the largest bucket: fresh buffers, an eager forward
            src, bufs = host, self._alloc(num_tokens)
        rows = bufs["rows"][:, :num_tokens]
        md = AttentionMetadata(
            num_tokens=num_tokens,
            num_actual=n,
            slot_mapping=rows[2],
            positions=rows[1],
            seq_ids=bufs["seq_ids"][:num_tokens],
            valid=bufs["valid"][:num_tokens],
            host_seq_ids=host[3, :n],
            host_positions=host[1, :n],
            fresh_bounds=bufs.get("bounds"),
        )
        return StagedBatch(md, rows[0], rows, src)

    def upload(self, staged: StagedBatch) -> None:
        """The staged rows to the device, unpacked into the metadata's views (device work only: a graph may record
        it for a bucket, reading the staging buffer at every replay)."""
        md = staged.md
        for i in range(4):  # row by row: each a contiguous pinned → device copy, one memcpy node in a graph (a
            # [4, T] slice of the [4, capacity] buffers is strided, and torch would copy it through a host
            # temporary made at capture time, which a replay would then read forever)
            staged.rows[i].copy_(staged.host[i], non_blocking=True)
        md.seq_ids.copy_(staged.rows[3])
        torch.ge(md.seq_ids, 0, out=md.valid)
        if md.fresh_bounds is not None:
            sequence_bounds(md.seq_ids, out=md.fresh_bounds)

    def fill(self, batch: PackedBatch, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """stage + upload: write `batch` padded to `num_tokens` rows; returns (input_ids, positions, metadata)."""
        staged = self.stage(batch, num_tokens)
        self.upload(staged)
        self.mark_uploaded()
        return staged.input_ids, staged.md.positions, staged.md

    def mark_uploaded(self) -> None:
        """Record that the staging rows are being read (the next `stage` waits for it before writing them)."""
        if self.uploaded is not None:
            self.uploaded.record()
