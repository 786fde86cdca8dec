"""What one rank of a TP=2 test measures (spawned by tp_ranks.run_ranks): the same full model at TP=1 and TP=2,
eagerly and under piecewise/breakable, and planted faults that the TP2-vs-TP1 check must catch."""

from __future__ import annotations

import torch

from pcg_helpers import CONFIGS, make_engine, prompts_of, tiny_model
from pcg_core import load_model
from pcg_core.distributed import init_from_env, shard_model

# beside pcg_helpers' table: MLA, a dense then a MoE layer; Grok-2's own module (soft-cap, length temperature, a dense
# MLP beside its experts), sharded by pcg's plan
EXTRA = {"deepseek-v3": "deepseek-ai__DeepSeek-V3.json", "grok-2": "xai-org__grok-2.json",
         "qwen3-next": "Qwen__Qwen3-Next-80B-A3B-Instruct.json"}

NEW_TOKENS = 3


def _run(model: torch.nn.Module, backend: str, prompts: list[list[int]], pad_like=None) -> dict:
    """Prefill logits of the packed prompts (padded to `pad_like`'s bucket when given) and a short greedy run."""
    e = make_engine(model, backend)
    batch = e.prefill_batch(prompts)
    pad = pad_like.bucket_for(len(batch)) if pad_like is not None else None
    logits = e.logits(e.forward(batch, eager=pad is not None, pad_to=pad)).clone()
    outs = e.generate(prompts, NEW_TOKENS, prompt_logprobs=True)
    return {"logits": logits, "tokens": [o.output_ids for o in outs],
            "logprobs": torch.tensor([x for o in outs for x in o.prompt_logprobs + o.output_logprobs]), "engine": e}


def _diff(a: dict, b: dict) -> dict:
    return {"logits": float((a["logits"] - b["logits"]).abs().max()),
            "close": torch.allclose(a["logits"], b["logits"], atol=1e-5, rtol=1e-5)
            and torch.allclose(a["logprobs"], b["logprobs"], atol=1e-5, rtol=1e-5),
            "tokens_equal": a["tokens"] == b["tokens"]}


def measure(rank: int, arch: str, faults: bool) -> dict:
    group = init_from_env("cpu")
    prompts = prompts_of([5, 11, 2], 2048, seed=1)
    lm = load_model(CONFIGS / EXTRA[arch], tiny=True) if arch in EXTRA else tiny_model(arch)
    tp1 = _run(lm.model, "disabled", prompts)
    q_full = lm.model.model.layers[0].self_attn.q_proj.weight.detach().clone() if faults else None
    record = shard_model(lm.model, group)
    tp2 = _run(lm.model, "disabled", prompts)
    out = {"rank": rank, "tp2_vs_tp1": _diff(tp2, tp1), "all_reduces": record.all_reduces,
           "kv_heads": next(k for k in tp2["engine"].cache.k if k is not None).shape[1]}  # a linear layer has none
    for backend in ("piecewise", "breakable"):
        graph = _run(lm.model, backend, prompts)
        eager = _run(lm.model, "disabled", prompts, pad_like=graph["engine"])  # eager at the graph's padding
        out[backend] = {"bitwise_logits": torch.equal(graph["logits"], eager["logits"]),
                        # a whole generate pads each forward to its bucket, unpadded eager does not: close, not bitwise
                        "generate": _diff(graph, tp2),
                        "split_ops": graph["engine"].stats.split_ops}
    if faults:
        layer = lm.model.model.layers[0]
        layer.mlp.down_proj.__class__ = torch.nn.Linear  # the MLP's partial sum never reduced
        out["skipped_all_reduce"] = _diff(_run(lm.model, "disabled", prompts), tp1)
        layer.mlp.down_proj.__class__ = type(layer.self_attn.o_proj)
        q = layer.self_attn.q_proj
        n = q.weight.shape[0]
        q.weight.data = q_full[(1 - rank) * n:(2 - rank) * n].clone()  # the other rank's heads
        out["wrong_rank_slice"] = _diff(_run(lm.model, "disabled", prompts), tp1)
    return out
