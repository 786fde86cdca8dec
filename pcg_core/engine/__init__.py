"""The engine: packed ragged batches, KV cache, prefill and greedy decode, logprobs."""

from pcg_core.engine.engine import Engine, SequenceOutput
from pcg_core.engine.inputs import PackedBatch
from pcg_core.engine.kv_cache import KVCache

__all__ = ["Engine", "KVCache", "PackedBatch", "SequenceOutput"]
