"""The engine: packed ragged batches, prefill and greedy decode, logprobs (the KV cache lives with attention)."""

from pcg_core.engine.engine import Engine, SequenceOutput
from pcg_core.engine.inputs import PackedBatch

__all__ = ["Engine", "PackedBatch", "SequenceOutput"]
