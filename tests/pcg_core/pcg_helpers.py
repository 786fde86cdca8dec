"""Helpers shared by the pcg_core tests: the model table, engine construction, prompts, and the comparisons
(`compare_outputs`, the padding and KV-cache checks) that the planted-fault tests show to be sharp."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from pcg_core import CaptureConfig, Engine, EngineConfig, SequenceOutput, load_model

CONFIGS = Path(__file__).resolve().parents[2] / "harness" / "models" / "configs"

# name → (config file, transformers class, is MoE)
ARCHS: dict[str, tuple[str, str, bool]] = {
    "llama": ("meta-llama__Llama-3.1-8B-Instruct.json", "LlamaForCausalLM", False),
    "qwen2": ("Qwen__Qwen2.5-0.5B.json", "Qwen2ForCausalLM", False),
    "qwen3": ("Qwen__Qwen3-0.6B.json", "Qwen3ForCausalLM", False),
    "qwen3-8b": ("Qwen__Qwen3-8B.json", "Qwen3ForCausalLM", False),
    "qwen3-moe": ("Qwen__Qwen3-30B-A3B.json", "Qwen3MoeForCausalLM", True),
    "mixtral": ("mistralai__Mixtral-8x7B-v0.1.json", "MixtralForCausalLM", True),
    "gpt-oss": ("openai__gpt-oss-120b.json", "GptOssForCausalLM", True),
}
ARCH_NAMES = list(ARCHS)
GRAPH_BACKENDS = ["piecewise", "breakable", "full"]

MAX_TOKENS = 64
KV_SLOTS = 512


def config_path(arch: str) -> Path:
    return CONFIGS / ARCHS[arch][0]


def tiny_model(arch: str, layers: int = 2, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0):
    return load_model(config_path(arch), tiny=True, layers=layers, dtype=dtype, device=device, seed=seed)


def routed_experts(arch: str):
    """A tiny MoE model's first fused experts module with 16 tokens routed to 2 experts each: (module, hidden
    states, top-k expert ids, top-k weights), seeded."""
    from pcg_core.quant.layers.experts import is_experts

    lm = tiny_model(arch)
    mod = next(m for m in lm.model.modules() if is_experts(m))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, lm.config.hidden_size, generator=g)
    idx = torch.stack([torch.randperm(mod.num_experts, generator=g)[:2] for _ in range(16)])
    w = torch.rand(16, 2, generator=g)
    return mod, x, idx, w


def make_engine(
    model: torch.nn.Module,
    backend: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    max_tokens: int = MAX_TOKENS,
    kv_slots: int = KV_SLOTS,
    buckets: list[int] | None = None,
    compiler: str = "eager",
) -> Engine:
    cap = CaptureConfig(backend=backend, compiler=compiler, max_tokens=max_tokens, buckets=buckets)
    return Engine(model, EngineConfig(device=device, dtype=dtype, capture=cap, kv_slots=kv_slots))


def prompts_of(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


# Prompt sets at the bucket edges of max_tokens=64 (ladder 4, 8, ..., 32, 48, 64).
CASES: dict[str, list[int]] = {
    "one_token": [1],  # → bucket 4, 3 padding rows
    "exact_16": [16],  # → bucket 16, no padding
    "bucket_plus_1": [17],  # → bucket 20
    "above_max": [65],  # → no bucket: eager fallback
    "packed_8": [1, 2, 3, 5, 7, 8, 9, 11],  # 46 tokens → bucket 48; decode steps of 8 → bucket 8
}
MAX_NEW_TOKENS = 5


def compare_outputs(
    ref: list[SequenceOutput], cand: list[SequenceOutput], tol: float, *, divergence: str = "tie", k: int = 5
) -> list[str]:
    """Every way `cand` differs from `ref` beyond `tol` (absolute, on logprobs); empty when they agree.

    Prompt logprobs and prompt top-k logprobs are compared position by position. Output tokens are compared
    step by step; at the first step where the greedy tokens differ the comparison of that sequence stops (the
    two runs then condition on different tokens), and the difference itself is a mismatch unless:
      divergence="tie":  the reference's top-2 logprobs are within 2*tol there (a legitimate tie flip);
      divergence="topk": each run's token is in the other's top-k there (the looser low-precision rule).
    """
    out: list[str] = []
    if len(ref) != len(cand):
        return [f"{len(ref)} reference sequences but {len(cand)} candidate sequences"]

    def close(a: list[float], b: list[float]) -> tuple[bool, float]:
        if len(a) != len(b):
            return False, math.inf
        if not a:
            return True, 0.0
        d = (torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs()
        worst = float(torch.nan_to_num(d, nan=math.inf).max())
        return worst <= tol, worst

    for i, (r, c) in enumerate(zip(ref, cand)):
        if r.prompt_ids != c.prompt_ids:
            out.append(f"seq {i}: prompts differ")
            continue
        if (r.prompt_logprobs is None) != (c.prompt_logprobs is None):
            out.append(f"seq {i}: prompt logprobs present in only one run")
        elif r.prompt_logprobs is not None:
            ok, worst = close(r.prompt_logprobs, c.prompt_logprobs)
            if not ok:
                out.append(f"seq {i}: prompt logprobs differ by {worst:.3g} > {tol:g}")
            for pos, (rt, ct) in enumerate(zip(r.prompt_topk_logprobs, c.prompt_topk_logprobs)):
                ok, worst = close(rt, ct)
                if not ok:
                    out.append(f"seq {i}: prompt top-k logprobs at position {pos} differ by {worst:.3g}")
                    break
        if len(r.output_ids) != len(c.output_ids):
            out.append(f"seq {i}: {len(r.output_ids)} reference tokens but {len(c.output_ids)} candidate tokens")
            continue
        for step, (rt, ct) in enumerate(zip(r.output_ids, c.output_ids)):
            if rt != ct:
                r_top, c_top = r.output_topk_ids[step][:k], c.output_topk_ids[step][:k]
                if divergence == "tie":
                    lp = r.output_topk_logprobs[step]
                    tie = len(lp) > 1 and lp[0] - lp[1] <= 2 * tol
                    if not tie:
                        out.append(f"seq {i} step {step}: token {ct} != reference {rt} (no tie: top-2 gap {lp[0] - lp[1]:.3g})")
                elif divergence == "topk":
                    if ct not in r_top or rt not in c_top:
                        out.append(f"seq {i} step {step}: token {ct} vs reference {rt} not in each other's top-{k}")
                else:
                    raise ValueError(divergence)
                break
            ok, worst = close([r.output_logprobs[step]], [c.output_logprobs[step]])
            if not ok:
                out.append(f"seq {i} step {step}: output logprob differs by {worst:.3g} > {tol:g}")
            ok, worst = close(r.output_topk_logprobs[step], c.output_topk_logprobs[step])
            if not ok:
                out.append(f"seq {i} step {step}: top-k logprobs differ by {worst:.3g} > {tol:g}")
    return out


def snapshot_cache(cache) -> list[torch.Tensor]:
    return [t.clone() for t in cache.k + cache.v]


def changed_slots(before: list[torch.Tensor], cache) -> set[int]:
    """Slots whose K or V changed in any layer since `before`."""
    changed: set[int] = set()
    for old, new in zip(before, cache.k + cache.v):
        diff = (old != new).flatten(1).any(dim=1)  # [slots+1, kv_heads, head_dim] → [slots+1]
        changed |= set(torch.nonzero(diff).flatten().tolist())
    return changed


def padding_violations(out: torch.Tensor, num_actual: int) -> list[str]:
    """Padding rows of an attention output must be exactly zero; real rows must be finite."""
    problems = []
    pad = out[num_actual:]
    if pad.numel() and not bool((pad == 0).all()):
        bad = int((pad != 0).flatten(1).any(dim=1).sum())
        problems.append(f"{bad} of {pad.shape[0]} padding rows are not exactly zero")
    if not bool(torch.isfinite(out[:num_actual]).all()):
        problems.append("real rows hold non-finite values")
    return problems


def plant_stale_positions(engine, monkeypatch):
    """Fault: from the second forward on, the static positions buffer keeps the previous batch's positions
    (as if the engine forgot to copy them); the attention mask is still built from the right ones."""
    original = engine.stage_inputs
    calls = []

    def stale_stage(batch, num_tokens, replay):
        positions = engine.inputs._dev["rows"][1]
        before = positions.clone()
        result = original(batch, num_tokens, replay)
        if calls:
            positions.copy_(before)
        calls.append(num_tokens)
        return result

    monkeypatch.setattr(engine, "stage_inputs", stale_stage)
    return calls


def transformers_twin(lm, attn_implementation: str = "eager"):
    """transformers' own modules as written (eager experts; DeepSeek's expanded MLA), built from lm's config with
    lm's weights, dtype and device: the reference a model port is held to."""
    import copy

    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_config(copy.deepcopy(lm.config), attn_implementation=attn_implementation,
                                           experts_implementation="eager", dtype=lm.model.dtype).eval()
    ref.load_state_dict(lm.model.state_dict())
    return ref.to(next(lm.model.parameters()).device)


def transformers_prompt_logprobs(lm, prompt: list[int]) -> list[float]:
    """The prompt logprobs of transformers' own forward (transformers_twin, eager attention)."""
    ref = transformers_twin(lm)
    with torch.no_grad():
        lp = torch.log_softmax(ref(input_ids=torch.tensor([prompt])).logits[0].float(), -1)
    return lp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()
