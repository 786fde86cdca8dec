"""pcg::ep_all_to_all_ on two and four gloo ranks: each rank's own tokens, routed with a skew (one rank's tokens all
to its own experts, so it sends nothing; a rank that receives nothing), reach the experts spread over the ranks and
come back equal to the whole experts run in one process; a receiver that reads its range wrong is caught; a deep
copy rebound runs its own experts, not its original's."""

from __future__ import annotations

import copy

import pytest
import torch

from tp_ranks import run_ranks

HIDDEN, INTER, EXPERTS, TOP_K = 72, 40, 8, 2  # an odd hidden width, experts that divide over 2 and 4 ranks


def _experts() -> torch.nn.Module:
    """Qwen3-MoE's experts, every rank the same weights, scales varying by expert and row, a few outliers."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS,
                            num_experts_per_tok=TOP_K)
    m = Qwen3MoeExperts(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in (m.gate_up_proj, m.down_proj):
            scale = torch.rand(w.shape[0], w.shape[1], 1, generator=g) * 2 + 0.1
            w.copy_(torch.randn(w.shape, generator=g) * scale * w.shape[-1] ** -0.5)
            w.view(-1)[torch.randint(0, w.numel(), (8,), generator=g)] *= 20
    return m


def _routes(rank: int, world: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank 0's tokens all go to its own experts (it sends nothing away); the others' spread over every expert but,
    past two ranks, rank 2's (which then receives nothing)."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(tokens, HIDDEN, generator=g)
    x[0] *= 30  # an outlier token
    per = EXPERTS // world
    if rank == 0:
        allowed = torch.arange(per)
    else:
        allowed = torch.tensor([e for e in range(EXPERTS) if world == 2 or not 2 * per <= e < 3 * per])
    index = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:TOP_K]] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, TOP_K, generator=g), -1)
    return x, index, weights


def dispatched(rank: int, world: int, wrong_range: bool) -> dict:
    from pcg_core.distributed import init_from_env
    from pcg_core.distributed.group import ParallelGroup
    from pcg_core.distributed.shard import _experts_by_index
    from pcg_core.split_ops import rebind_copies

    group: ParallelGroup = init_from_env("cpu")
    whole = _experts()
    mine = _experts()
    _experts_by_index(mine, group, "experts", dispatch=True)
    if wrong_range and rank == 1:
        mine.ep_start = 0  # planted: rank 1 answers for rank 0's experts
    x, index, weights = _routes(rank, world, tokens=5 + 3 * rank)  # ranks hold different token counts
    with torch.no_grad():
        want = whole(x, index, weights)
        got = mine(x, index, weights)
        twin = copy.deepcopy(mine)
        twin.down_proj.data.mul_(2)  # the copy's own weights: its dispatch must run them
        rebind_copies(twin)
        doubled = twin(x, index, weights)
    return {"diff": (got - want).abs().max().item(), "scale": want.abs().max().item(),
            "twin_diff": (doubled - 2 * got).abs().max().item(), "keys_differ": twin.pcg_split_key != mine.pcg_split_key}


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_dispatch_equals_the_whole_experts(world):
    for r in run_ranks(dispatched, world, False, world=world):
        assert r["diff"] <= 1e-5 * r["scale"], r
        assert r["keys_differ"] and r["twin_diff"] <= 1e-5 * r["scale"], r


def test_a_receiver_reading_the_wrong_expert_range_is_caught():
    results = run_ranks(dispatched, 2, True)
    assert max(r["diff"] / r["scale"] for r in results) > 1e-2, results
