"""The engine: packed ragged batches, prefill and greedy decode, logprobs (the KV cache lives with attention)."""

from pcg_core.engine.engine import Engine, SequenceOutput
from pcg_core.engine.inputs import PackedBatch
from pcg_core.engine.prefix_cache import PrefixCache

__all__ = ["Engine", "PackedBatch", "PrefixCache", "SequenceOutput"]
