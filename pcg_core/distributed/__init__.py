"""Tensor parallelism at run time: the process group from env:// (group.py), the collective split op
`pcg::all_reduce_` (ops.py), and sharding a built model by transformers' TP plans into plain local shards
(plan.py, shard.py, layers.py)."""

from pcg_core.distributed.group import ParallelGroup, env_world_size, get_group, init_from_env, rank_device, register_group, shutdown
from pcg_core.distributed.plan import TP_DEGREES, tp_unsupported_reason
from pcg_core.distributed.shard import TensorParallel, shard_model, tensor_parallel_of

__all__ = ["ParallelGroup", "TP_DEGREES", "TensorParallel", "env_world_size", "get_group", "init_from_env",
           "rank_device", "register_group", "shutdown", "shard_model", "tensor_parallel_of", "tp_unsupported_reason"]
