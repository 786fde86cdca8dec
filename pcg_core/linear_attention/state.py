"""The per-sequence state pool of linear-attention layers (Qwen3-Next's Gated DeltaNet), beside the paged KV cache.

A linear layer keeps no KV per token: each live sequence carries a conv state (the last kernel-1 inputs of the
causal conv1d, model dtype) and a recurrent state ([Hv, Dk, Dv], float32, as fla and transformers keep it) per
layer. A sequence gets one slot when it is allocated; the slot's state is zeroed then, so a slot reused by a new
sequence never starts from its previous owner's state.

Each slot holds two versions (ping-pong), each with the number of tokens it has consumed (host side): a forward
over positions p..p+L-1 of a sequence reads the version at length p and writes the other one at p+L. So running
the same forward again (the judge runs eager unpadded, padded and again on the same step) reads the same state
and gives the same output, as re-running a forward over the KV cache does: a single in-place state would have
advanced once per run. The tensors are allocated once (fixed addresses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pcg_core.errors import ConfigError


class LinearStateFull(RuntimeError):
    """More live sequences than state slots; the message names `linear_state_slots`."""


@dataclass(frozen=True)
class LinearLayerShape:
    """What a linear-attention layer keeps per sequence: conv channels × (kernel - 1), Hv × Dk × Dv."""

    conv_dim: int
    conv_kernel: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int


@dataclass(frozen=True)
class Run:
    """The rows of one sequence in a forward: rows [start, start+length) at positions from `position`; its state is
    read from version `read` of `slot` and written to the other version."""

    seq_id: int
    slot: int
    start: int
    length: int
    position: int
    read: int


def linear_layer_shape(config, tp: int = 1) -> LinearLayerShape:
    """The per-sequence state shape of a Qwen3-Next-style config (linear_* fields), at one of `tp` ranks sharding
    the heads."""
    kh, vh = config.linear_num_key_heads // tp, config.linear_num_value_heads // tp
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    return LinearLayerShape(2 * kh * dk + vh * dv, config.linear_conv_kernel_dim, vh, dk, dv)


def linear_layers(config) -> list[int]:
    """Decoder layers whose layer_types entry is linear_attention (none for models without layer_types)."""
    types = getattr(config, "layer_types", None) or []
    return [i for i, t in enumerate(types) if t == "linear_attention"]


class LinearStatePool:
    def __init__(self, layers: list[int], shape: LinearLayerShape, num_slots: int, dtype: torch.dtype,
                 device: torch.device):
        if num_slots < 1:
            raise ConfigError(f"linear_state_slots must be positive, got {num_slots}", field="linear_state_slots")
        self.shape, self.num_slots, self.layers = shape, num_slots, list(layers)
        s = shape
        # [slot, version, ...] per linear layer, keyed by decoder layer index
        self.conv = {i: torch.zeros(num_slots, 2, s.conv_dim, s.conv_kernel - 1, dtype=dtype, device=device)
                     for i in layers}
        self.recurrent = {i: torch.zeros(num_slots, 2, s.num_v_heads, s.head_k_dim, s.head_v_dim, dtype=torch.float32,
                                         device=device) for i in layers}
        self.slot_of: dict[int, int] = {}  # sequence → slot
        self.length = [[-1, -1] for _ in range(num_slots)]  # tokens consumed by each version (-1: none)
        self._free = list(range(num_slots))
        self.runs: list[Run] = []  # this forward's, set by begin_forward

    def reset(self) -> None:
        """Forget all sequences (states are zeroed when a slot is handed out again)."""
        self.slot_of.clear()
        self._free = list(range(self.num_slots))
        self.length = [[-1, -1] for _ in range(self.num_slots)]
        self.runs = []

    def allocate(self, seq_id: int) -> int:
        """A slot for `seq_id`, its state zeroed (version 0 at length 0)."""
        if seq_id in self.slot_of:
            raise ValueError(f"sequence {seq_id} already holds a linear-state slot")
        if not self._free:
            raise LinearStateFull(f"linear-attention state pool full: all {self.num_slots} slots hold live sequences; "
                                  "raise linear_state_slots (EngineConfig)")
        slot = self._free.pop(0)
        self._zero(slot)
        self.length[slot] = [0, -1]
        self.slot_of[seq_id] = slot
        return slot

    def _zero(self, slot: int) -> None:
        for i in self.layers:
            self.conv[i][slot, 0].zero_()
            self.recurrent[i][slot, 0].zero_()

    def begin_forward(self, host_seq_ids: torch.Tensor, host_positions: torch.Tensor) -> None:
        """Plan this forward from the real rows (host tensors): one Run per stretch of a sequence's rows, reading the
        version whose length is the stretch's first position, and record the written version's new length."""
        seqs, pos = host_seq_ids.tolist(), host_positions.tolist()
        runs: list[Run] = []
        r = 0
        while r < len(seqs):
            end = r
            while end + 1 < len(seqs) and seqs[end + 1] == seqs[r] and pos[end + 1] == pos[end] + 1:
                end += 1
            seq, p = seqs[r], pos[r]
            if any(run.seq_id == seq for run in runs):
                raise ValueError(f"sequence {seq} has two stretches of rows in one forward; a linear-attention layer "
                                 "needs each sequence's rows together and in position order")
            if seq not in self.slot_of:
                raise ValueError(f"sequence {seq} has no linear-state slot; allocate one (Engine.pack_prompts does)")
            slot = self.slot_of[seq]
            if p not in self.length[slot]:
                raise ValueError(f"sequence {seq}: its linear-attention state at position {p} is not held (held: "
                                 f"{[n for n in self.length[slot] if n >= 0]}); forwards must continue a sequence "
                                 "where it stopped, or repeat the last one")
            runs.append(Run(seq, slot, r, end - r + 1, p, self.length[slot].index(p)))
            r = end + 1
        for run in runs:
            self.length[run.slot][1 - run.read] = run.position + run.length
        self.runs = runs

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.conv, self.recurrent) for t in d.values())
