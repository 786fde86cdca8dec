"""Tensor parallelism in one process: the plan, what is refused and why, the collective split op, and the traced
graph of a sharded model (sharding slices tensors and talks to no one, so a group of two can be named here)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from pcg_helpers import tiny_model

from pcg_core.capabilities import PARALLEL, capabilities, parallel_gpus, parallel_unsupported_reason
from pcg_core.distributed import ParallelGroup, shard_model, tp_unsupported_reason
from pcg_core.distributed.layers import RowParallelLinear
from pcg_core.errors import UnsupportedModel
from pcg_core.split_ops import split_op_names

PAIR = ParallelGroup(rank=0, size=2, name="test-pair", backend="gloo")
ALL_REDUCE = "pcg::all_reduce_"


def traced_graph(model: torch.nn.Module, tokens: int = 8) -> torch.fx.GraphModule:
    """The Dynamo graph of the model's decoder (as the piecewise backend gets it), never run."""
    from pcg_helpers import make_engine

    graphs = []

    class Stop(Exception):
        pass

    def record(gm, example_inputs):
        graphs.append(gm)
        raise Stop

    engine = make_engine(model, "disabled")
    ids, pos, ctx = engine._dummy_inputs(tokens)
    from pcg_core.forward_context import set_forward_context

    torch._dynamo.reset()
    with set_forward_context(ctx), pytest.raises(Exception) as raised:
        torch.compile(engine._body, backend=record, fullgraph=True)(ids, pos)
    assert graphs, f"dynamo did not reach the backend: {raised.value}"
    return graphs[0]


def count_ops(gm: torch.fx.GraphModule, name: str) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function"
               and str(getattr(getattr(n.target, "overloadpacket", n.target), "_qualified_op_name", "")) == name)


def test_all_reduce_is_a_split_op_and_the_table_says_where_it_runs():
    assert ALL_REDUCE in split_op_names()
    op = capabilities()["split_ops"][ALL_REDUCE]
    assert op["in_graph"] == {"piecewise": False, "breakable": False, "full": True} and op["capturable"]


def test_parallel_modes_are_a_rule_and_the_reasons_name_what_is_missing():
    assert PARALLEL == {"tp1": 1, "tp2": 2, "tp4": 4, "tp8": 8, "tp2-ep2": 2, "tp4-ep4": 4, "tp8-ep8": 8, "pp2": 2,
                        "pp4": 4, "dp2": 2, "dp4": 4, "ep2": 2, "ep4": 4, "tp2-pp2": 4, "pp2-dp2": 4,
                        "pp2-ep2": 4, "tp2-pp2-ep2": 4, "tp2-dp2": 4, "tp2-dp2-ep2": 4, "tp2-dp2-ep4": 4,
                        "tp2-ep4": 4} and parallel_gpus("tp2-pp2-dp2-ep8") == 8 * 2
    assert parallel_unsupported_reason("tp2") is None and parallel_unsupported_reason("tp8") is None
    assert "tensor parallelism 16 is not run yet" in parallel_unsupported_reason("tp16")
    assert parallel_unsupported_reason("pp2") is None and PARALLEL["pp2"] == 2
    assert "pipeline parallelism 8 is not run yet" in parallel_unsupported_reason("pp8")
    assert parallel_unsupported_reason("tp2-pp2") is None and "this combination is not run yet" in parallel_unsupported_reason("tp4-pp2")
    assert parallel_unsupported_reason("tp2-dp2") is None and "data-parallel attention" in parallel_unsupported_reason("tp4-dp2")
    assert parallel_unsupported_reason("tp2-ep2") is None and PARALLEL["tp2-ep2"] == 2
    assert parallel_unsupported_reason("tp2-ep4") is None and "more ranks than TP with TP > 1" in parallel_unsupported_reason("tp2-ep8")
    assert parallel_unsupported_reason("ep2") is None and "expert parallelism 8 is not run yet" in parallel_unsupported_reason("ep8")


@pytest.mark.parametrize("arch,layers", [("llama", 2), ("qwen3", 3)])
def test_traced_graph_has_two_all_reduces_and_one_attention_per_layer_and_no_dtensor(arch, layers):
    lm = tiny_model(arch, layers=layers)
    tp = shard_model(lm.model, PAIR)
    assert tp.all_reduces == 2 * layers and tp.kv_heads * 2 == lm.config.num_key_value_heads
    assert not any(isinstance(p, DTensor) for p in lm.model.parameters())
    gm = traced_graph(lm.model)
    assert count_ops(gm, ALL_REDUCE) == 2 * layers and count_ops(gm, "pcg::attention") == layers
    for node in gm.graph.nodes:
        assert not isinstance(node.meta.get("example_value"), DTensor), node
        assert "dtensor" not in str(node.target).lower() and "c10d" not in str(node.target), node


def test_a_model_is_sharded_once():
    lm = tiny_model("llama", layers=1)
    shard_model(lm.model, PAIR)
    with pytest.raises(ValueError, match="already sharded"):
        shard_model(lm.model, PAIR)


def test_the_count_check_catches_a_dropped_all_reduce():
    """Planted: one rowwise layer left a plain Linear (its partial sum never reduced) shows in the count."""
    lm = tiny_model("llama", layers=2)
    shard_model(lm.model, PAIR)
    lm.model.model.layers[1].mlp.down_proj.__class__ = torch.nn.Linear
    assert count_ops(traced_graph(lm.model), ALL_REDUCE) == 3


def test_moe_experts_keep_every_expert_with_a_slice_of_its_intermediate():
    lm = tiny_model("qwen3-moe", layers=1)
    experts = lm.model.model.layers[0].mlp.experts
    gate_up, down = experts.gate_up_proj.clone(), experts.down_proj.clone()
    inter = down.shape[2]
    tp = shard_model(lm.model, ParallelGroup(rank=1, size=2, name="test-pair", backend="gloo"))
    half = inter // 2
    assert torch.equal(experts.gate_up_proj[:, :half], gate_up[:, half:inter])  # rank 1's gate half
    assert torch.equal(experts.gate_up_proj[:, half:], gate_up[:, inter + half:])  # and its up half
    assert torch.equal(experts.down_proj, down[:, :, half:])
    assert tp.all_reduces == 2 and type(lm.model.model.layers[0].self_attn.o_proj) is RowParallelLinear


@pytest.mark.parametrize("arch", ["qwen3-next-80b-a3b", "qwen2.5-vl-7b", "qwen3-vl-30b-a3b", "gpt-oss-120b", "grok-2"])
def test_every_seed_architecture_has_a_plan_and_what_it_cannot_divide_is_refused(arch):
    """Linear attention by key-head group, VLMs' text decoders, gpt-oss's heads and sinks, Grok-2's own module: each
    has a plan at tp2 (transformers' or pcg's); a degree the runtime does not run, or that does not divide the
    linear-attention key heads, is refused with the reason."""
    from harness.cards import find_card
    from pcg_core.model import build_config, shrink_config

    config = build_config(shrink_config(find_card(arch).config, tiny=True))
    assert tp_unsupported_reason(config, 2) is None
    assert "tensor parallelism 16" in tp_unsupported_reason(config, 16)
    text = config.get_text_config()
    if getattr(text, "linear_num_key_heads", None):
        text.linear_num_key_heads = 3
        assert "linear-attention layers' 3 key heads" in tp_unsupported_reason(config, 2)


def test_a_degree_that_does_not_divide_the_heads_is_refused():
    lm = tiny_model("llama", layers=1)
    lm.model.config.num_key_value_heads = 3  # as a model with 3 KV heads would say
    with pytest.raises(UnsupportedModel, match="does not divide the heads"):
        shard_model(lm.model, PAIR)
    assert "TP 1, 2, 4, 8 only" in tp_unsupported_reason(lm.model.config, 16)


def test_mla_heads_are_sharded_and_the_latent_stays_whole():
    """DeepSeek-V3: q_b and kv_b rows by head, o_proj's columns; the latent projection (one row per token, the
    cache's) whole on every rank. Layer 0 dense (2 all-reduces), layer 1 MoE: attention, shared expert, experts."""
    from pcg_helpers import CONFIGS
    from pcg_core import load_model

    lm = load_model(CONFIGS / "deepseek-ai__DeepSeek-V3.json", tiny=True)
    attn = lm.model.model.layers[1].self_attn
    kv_b, kv_a = attn.kv_b_proj.weight.clone(), attn.kv_a_proj_with_mqa.weight.clone()
    tp = shard_model(lm.model, ParallelGroup(rank=1, size=2, name="test-pair", backend="gloo"))
    assert attn.num_heads == 2 and torch.equal(attn.kv_b_proj.weight, kv_b[kv_b.shape[0] // 2:])
    assert torch.equal(attn.kv_a_proj_with_mqa.weight, kv_a) and tp.all_reduces == 5


def test_a_rank_finds_its_gpu_and_a_half_set_environment_is_refused(monkeypatch):
    from pcg_core.distributed import init_from_env, rank_device
    from pcg_core.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert rank_device("cuda") == "cuda:1" and rank_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # the launcher narrowed CUDA_VISIBLE_DEVICES
    assert rank_device("cuda") == "cuda:0"
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ConfigError, match="RANK.*unset.*pcgh cell --parallel"):
        init_from_env("cpu")
