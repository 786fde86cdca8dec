"""Planted faults for the judge: capture backends that go stale the way real ones do, one per class of blind spot.

Each fault wraps a built-in backend's `run` (the replay path: on a GPU the CUDA graphs, on a CPU the padded split
path standing in for them), so the eager reference never sees it. Registered as `planted_<fault>_<base>`; cell
workers load this module through PCG_PLUGINS (with tests/harness/cell on PYTHONPATH), the tests import it.

- top_region: prefill at a bucket of the ladder's top region (its coarse steps) is off by 1% — nothing below
  the top region shows it.
- layout_keyed: the sequence layout is cached per (bucket, number of sequences): a second batch at that bucket
  with as many sequences but other lengths or another order attends across the wrong boundaries.
- rope_shift: forwards with a position at or past the largest bucket rotate with positions shifted down by half
  the largest bucket (the KV slots and mask stay right; a VLM's M-RoPE rows shift alike).
- flaky_lag: in one process out of three (the 2nd, 5th … counted in PCG_PLANTED_DIR, else by pid) decode
  steps rotate with positions one behind.
- kv_drop_decode: decode steps on the graph path write the first attention layer's KV into the pad slot (a
  skipped write); the token's own key and value are missing from every later step.
- benign_pad (control, must pass): padding rows get other token ids and positions; padding must not matter.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.full import FullBackend
from pcg_core.capture.piecewise import PiecewiseBackend
from pcg_core.capture.registry import register_capture_backend

FAULTS = ("top_region", "layout_keyed", "rope_shift", "flaky_lag", "kv_drop_decode")
CONTROLS = ("benign_pad",)
BASES = {"piecewise": PiecewiseBackend, "breakable": BreakableBackend, "full": FullBackend}
# Faults that act through attention in the holes between graphs cannot fire where attention is recorded in
# graphs on a GPU: `full`, and `piecewise` over a capturable attention backend (all built-in ones).
NEEDS_HOLES = ("kv_drop_decode",)
NO_HOLES_ON_GPU = ("full", "piecewise")


def _is_decode(md) -> bool:
    """One token per sequence, none at position 0: a decode step (a host sync; fine for a test fault)."""
    n = md.num_actual
    seq, pos = md.seq_ids[:n], md.positions[:n]
    return bool(n > 0 and torch.unique(seq).numel() == n and int(pos.min()) > 0)


def _remask(md, attn_backend) -> None:
    """Rebuild the attention backend's metadata from the (possibly stale) seq ids, in place."""
    attn_backend.begin_forward(md)


class _DropWrite:
    """An attention backend whose KV write for the forward's first attention layer goes to the pad slot (layer 0,
    or a hybrid model's first full-attention layer: its linear layers keep no KV)."""

    def __init__(self, inner):
        self.inner, self.layer = inner, None

    def forward(self, q, k, v, out, params, md) -> None:
        if self.layer is None:
            self.layer = params.layer
        if params.layer == self.layer:
            md = dataclasses.replace(md, slot_mapping=torch.full_like(md.slot_mapping, self.inner.cache.pad_slot))
        self.inner.forward(q, k, v, out, params, md)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _process_fires() -> bool:
    if os.environ.get("PCG_PLANTED_FLAKY") == "always":  # the benchmark's in-process sweep: fire every time
        return True
    folder = os.environ.get("PCG_PLANTED_DIR")
    if not folder:
        return os.getpid() % 3 == 1
    counter = Path(folder) / "processes"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    return n % 3 == 1


class _Planted:
    fault = ""

    def prepare(self) -> None:
        super().prepare()
        self._layouts: dict[tuple[int, int], torch.Tensor] = {}
        self._fires = _process_fires() if self.fault == "flaky_lag" else True
        self._top = set(_top_region(self.config.ladder))

    def run(self, input_ids, positions, ctx):
        md, n, largest = ctx.attn_metadata, ctx.attn_metadata.num_actual, self.config.ladder[-1]
        f = self.fault
        if f == "layout_keyed":
            nseq = int(torch.unique(md.seq_ids[:n]).numel())
            key = (ctx.bucket, nseq)
            if key in self._layouts:
                md.seq_ids.copy_(self._layouts[key])
                _remask(md, ctx.attn_backend)
            else:
                self._layouts[key] = md.seq_ids.clone()
        elif f == "rope_shift" and int(positions[:n].max()) >= largest:
            self._shift_rotary(positions, n, torch.where(positions[:n] >= largest, largest // 2, 0))
        elif f == "flaky_lag" and self._fires and _is_decode(md):
            self._shift_rotary(positions, n, 1)
        elif f == "benign_pad" and n < ctx.bucket:
            input_ids[n:] = 7
            positions[n:] = 3
        if f == "kv_drop_decode" and _is_decode(md):
            inner = ctx.attn_backend
            ctx.attn_backend = _DropWrite(inner)
            try:
                return super().run(input_ids, positions, ctx)
            finally:
                ctx.attn_backend = inner
        out = super().run(input_ids, positions, ctx)
        if f == "top_region" and ctx.bucket in self._top and not _is_decode(md):
            out = out.clone()
            out[:n] *= 1.01
        return out

    def _shift_rotary(self, positions, n: int, shift) -> None:
        """Rotate the first n rows with positions `shift` lower: the positions, and a VLM's M-RoPE rows (what its
        rotary embedding reads; pcg_core/engine/vision.py)."""
        positions[:n] -= shift
        vision = getattr(getattr(self.body, "__self__", None), "vision", None)
        if vision is not None:
            vision.mrope[:, :n] -= shift


def _top_region(ladder: list[int]) -> list[int]:
    """The buckets above the ladder's last change of step (kept here, not imported, so that the benchmark can
    plant these faults into an older harness too)."""
    diffs = [b - a for a, b in zip([0, *ladder], ladder)]  # the step that leads to each bucket
    top = []
    for b, d in zip(reversed(ladder), reversed(diffs)):
        if d != diffs[-1]:
            break
        top.insert(0, b)
    return top


def planted_name(fault: str, base: str) -> str:
    return f"planted_{fault}_{base}"


for _fault in (*FAULTS, *CONTROLS):
    for _base, _cls in BASES.items():
        attrs = {"name": planted_name(_fault, _base), "fault": _fault}
        register_capture_backend(type(f"Planted_{_fault}_{_base}", (_Planted, _cls), attrs))
