"""What one GPU can show of tensor parallelism: a world of one (NCCL) whose pcg::all_reduce_ runs eagerly between
piecewise's and breakable's graphs and is captured inside `full`'s one graph, each bitwise equal to eager at the
same padding. Skipped without CUDA; the 2-rank path is the gloo tests' (test_tp_ranks.py)."""

from __future__ import annotations

import os

import pytest
import torch

from pcg_helpers import make_engine, prompts_of, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def world_of_one():
    import torch.distributed as dist

    from pcg_core.distributed import register_group
    from tp_ranks import free_port

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    yield register_group(dist.group.WORLD)


def _graph_equals_eager(lm, backend: str) -> None:
    """A prefill on `backend`'s graphs, logits bitwise equal to eager's at the same padding."""
    prompts = prompts_of([5, 11, 2], lm.config.vocab_size)
    graph = make_engine(lm.model, backend, device="cuda")
    eager = make_engine(lm.model, "disabled", device="cuda")
    batch = graph.prefill_batch(prompts)
    got = graph.logits(graph.forward(batch)).clone()
    batch = eager.prefill_batch(prompts)
    want = eager.logits(eager.forward(batch, eager=True, pad_to=graph.bucket_for(len(batch))))
    assert graph.stats.graphs_captured > 0
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("backend", ["piecewise", "breakable", "full"])
def test_all_reduce_of_a_world_of_one_under_each_backend_equals_eager(world_of_one, backend):
    from pcg_core.distributed import shard_model

    lm = tiny_model("llama", device="cuda")
    record = shard_model(lm.model, world_of_one)  # whole shards, but every rowwise layer through pcg::all_reduce_
    assert record.all_reduces == 4
    _graph_equals_eager(lm, backend)


@pytest.mark.parametrize("backend,kind", [(b, k) for b in ("piecewise", "breakable") for k in ("pp", "dp", "ep", "ep_all_to_all")]
                         + [("full", "dp"), ("full", "ep")])
def test_pipeline_and_data_parallel_ops_of_a_world_of_one_equal_eager(world_of_one, backend, kind):
    """The N-rank code paths of pp/dp/ep on NCCL with one rank: the last stage's broadcast (pp), the MoE blocks' gather
    and the output's (dp), the experts' all-reduce beside them (ep) or their all-to-all dispatch (NCCL's
    all_to_all_single with sizes read on the host) run between the graphs, bitwise equal to eager at the same
    padding. Under full the gathers and the all-reduce are recorded in its one graph (shapes fixed by the agreed
    bucket; a cell under full reaches its experts by the gather form, harness/cell/parallel.py); full is refused for
    pp by the pre-check, and pcg::pipeline_pass_ and the all-to-all dispatch raise inside a capture (below)."""
    from pcg_core.distributed.data_parallel import data_parallel_model
    from pcg_core.distributed.pipeline import pipeline_model
    from pcg_core.distributed.shard import shard_experts_by_index

    lm = tiny_model("llama" if kind == "pp" else "qwen3-moe", device="cuda")
    if kind == "pp":
        record = pipeline_model(lm.model, world_of_one)
        assert record.bounds == ((0, 2),)
    else:
        dispatch = kind == "ep_all_to_all"
        assert data_parallel_model(lm.model, world_of_one, gather_moe=not dispatch).gathers == (0 if dispatch else 2)
        if kind.startswith("ep"):
            assert shard_experts_by_index(lm.model, world_of_one, dispatch=dispatch) == 2
    _graph_equals_eager(lm, backend)


def test_an_all_to_all_dispatch_inside_a_cuda_graph_is_refused(world_of_one):
    from pcg_core.distributed.data_parallel import data_parallel_model
    from pcg_core.distributed.shard import shard_experts_by_index

    lm = tiny_model("qwen3-moe", device="cuda")
    data_parallel_model(lm.model, world_of_one, gather_moe=False)
    shard_experts_by_index(lm.model, world_of_one, dispatch=True)
    experts = lm.model.model.layers[0].mlp.experts
    x = torch.randn(4, lm.config.hidden_size, device="cuda", dtype=lm.model.dtype)
    index, weights = torch.zeros(4, 2, dtype=torch.int64, device="cuda"), torch.ones(4, 2, device="cuda", dtype=x.dtype)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="runs between graphs"):
        with torch.cuda.graph(g):
            experts(x, index, weights)


def test_a_pipeline_hand_off_inside_a_cuda_graph_is_refused(world_of_one):
    x = torch.ones(4, 8, device="cuda")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="runs between graphs"):
        with torch.cuda.graph(g):
            torch.ops.pcg.pipeline_pass_(x, world_of_one.name, 0, -1)
