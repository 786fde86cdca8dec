"""The forwards of one generate() call, in order: what a server's scheduler would hand the model.

First the prefill of every sequence that starts at once (in chunks of at most `chunk` tokens where asked: a later
chunk attends to the KV the earlier ones wrote), then decode steps of every sequence still generating — sequences
leave when they have their tokens, and a sequence that joins at step t (`join_at`) has its prompt packed after that
step's decode rows, one mixed forward, as continuous batching does. Engine.generate and the judge's lockstep both
walk a Schedule, so the judge compares exactly the batches the suite ran.

The caller runs each Forward, then hands back the next token of each sequence in `emit_seqs` (`advance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pcg_core.engine.inputs import PackedBatch


def chunks(batch: PackedBatch, size: int | None) -> list[PackedBatch]:
    """A packed prefill cut into forwards of at most `size` tokens (chunked prefill); the whole batch if None.
    A later chunk attends to the KV its earlier ones wrote: the mask is by sequence and slot position."""
    if size is None or len(batch) <= size:
        return [batch]
    return [PackedBatch(batch.token_ids[s : s + size], batch.positions[s : s + size], batch.seq_ids[s : s + size],
                        batch.slots[s : s + size]) for s in range(0, len(batch), size)]


def decode_batch(steps: list[tuple[int, int, int]], seq_slots: list[list[int]]) -> PackedBatch:
    """One decode step: (sequence, token, position) for each sequence still generating; seq_slots[i][p] is the
    KV slot of position p of sequence i (what KVCache.allocate returned)."""
    return PackedBatch([t for _, t, _ in steps], [p for _, _, p in steps], [i for i, _, _ in steps],
                       [seq_slots[i][p] for i, _, p in steps])


@dataclass
class Forward:
    """One forward: its batch, which rows give a sequence its next token, and which rows are scored on the next
    prompt token (prompt logprobs)."""

    batch: PackedBatch
    decode: bool  # decode rows only
    label: str
    emit_rows: list[int]  # rows whose logits give sequence emit_seqs[k] its next token
    emit_seqs: list[int]
    prompt_rows: list[int]  # rows of prompt tokens, in order (a sequence's last one is an emit row too)
    targets: list[int]  # per prompt row: the prompt token after it (-1 at a prompt's last token)


class Schedule:
    def __init__(self, prefill: PackedBatch, prompts: Sequence[Sequence[int]], cached: Sequence[int],
                 seq_slots: list[list[int]], new_tokens: Sequence[int], chunk: int | None = None,
                 join_at: Sequence[int] | None = None):
        """prefill: every prompt's computed tokens, packed (Engine.pack_prompts: sequence i's rows are its prompt
        from position cached[i] on). join_at[i]: the decode step sequence i's prompt joins (0: the first prefill)."""
        self.prompts, self.new, self.seq_slots, self.chunk = prompts, list(new_tokens), seq_slots, chunk
        self.join_at = list(join_at) if join_at is not None else [0] * len(prompts)
        if len(self.join_at) != len(prompts) or any(not isinstance(j, int) or j < 0 for j in self.join_at):
            raise ValueError("join_at: one decode step ≥ 0 per prompt (0: the first prefill)")
        self._rows: dict[int, PackedBatch] = {}  # each sequence's prefill rows
        # (sequence, slot) of each prefill row → the index of its prompt token: counted from the cached prefix in row
        # order, never read back from the positions, so a forward whose positions are wrong is still scored on the
        # prompt's own next tokens (and shows as wrong, not as a differently shaped output).
        self._prompt_index: dict[tuple[int, int], int] = {}
        for k, s in enumerate(prefill.seq_ids):
            b = self._rows.setdefault(s, PackedBatch([], [], [], []))
            self._prompt_index[(s, prefill.slots[k])] = cached[s] + len(b)
            b.token_ids.append(prefill.token_ids[k])
            b.positions.append(prefill.positions[k])
            b.seq_ids.append(s)
            b.slots.append(prefill.slots[k])
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self._pending: list[Forward] = self._prefill([i for i, j in enumerate(self.join_at) if j == 0])
        self._step = 0
        self._current: Forward | None = None

    def _prefill(self, seqs: list[int]) -> list[Forward]:
        if not seqs:
            return []
        batch = _concat(self._rows[i] for i in seqs)
        parts = chunks(batch, self.chunk)
        return [self._forward(p, f"prefill forward {k + 1} of {len(parts)} ({len(p)} tokens)", False, [])
                for k, p in enumerate(parts)]

    def _forward(self, batch: PackedBatch, label: str, decode: bool, emits: list[tuple[int, int]]) -> Forward:
        """The Forward of `batch`: `emits` (row, sequence) decode rows first, then prompt rows."""
        fwd = Forward(batch, decode, label, [r for r, _ in emits], [s for _, s in emits], [], [])
        for r in range(len(emits), len(batch)):
            s = batch.seq_ids[r]
            p = self._prompt_index[(s, batch.slots[r])]
            last = p == len(self.prompts[s]) - 1
            fwd.prompt_rows.append(r)
            fwd.targets.append(-1 if last else self.prompts[s][p + 1])
            if last:
                fwd.emit_rows.append(r)
                fwd.emit_seqs.append(s)
        return fwd

    def next(self) -> Forward | None:
        """The next forward to run, or None when every sequence has its tokens."""
        if self._current is not None:
            raise RuntimeError("advance() with the tokens of the last forward first")
        while not self._pending:
            self._step += 1
            active = [i for i, out in enumerate(self.outputs) if 0 < len(out) < self.new[i]]
            joining = [i for i, j in enumerate(self.join_at) if j == self._step]
            if not active and not joining:
                if any(j > self._step for j in self.join_at):
                    continue  # nobody runs at this step, a sequence joins later
                return None
            steps = [(i, self.outputs[i][-1], len(self.prompts[i]) + len(self.outputs[i]) - 1) for i in active]
            batch = _concat([decode_batch(steps, self.seq_slots), *(self._rows[i] for i in joining)])
            label = f"decode step {self._step} ({len(active)} sequences" + (f", {len(joining)} joining)" if joining else ")")
            self._pending = [self._forward(batch, label, not joining, [(r, i) for r, i in enumerate(active)])]
        self._current = self._pending.pop(0)
        return self._current

    def advance(self, tokens: Sequence[int]) -> None:
        """The next token of each of the last forward's emit_seqs, in order."""
        fwd, self._current = self._current, None
        if fwd is None or len(tokens) != len(fwd.emit_seqs):
            raise ValueError("advance: one token per emit row of the forward next() returned")
        for s, t in zip(fwd.emit_seqs, tokens):
            self.outputs[s].append(int(t))

    def fed(self) -> list[list[int]]:
        """Per sequence, the tokens whose KV it wrote: its prompt and every generated token but the last."""
        return [list(p) + out[:-1] for p, out in zip(self.prompts, self.outputs)]


def _concat(batches) -> PackedBatch:
    out = PackedBatch([], [], [], [])
    for b in batches:
        out.token_ids += b.token_ids
        out.positions += b.positions
        out.seq_ids += b.seq_ids
        out.slots += b.slots
    return out
