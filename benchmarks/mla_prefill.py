"""MLA prefill: absorbed (pcg's decode form) and pcg's fresh-prefill path against expanded (what transformers and
FA-based engines run for prefill).

    python benchmarks/mla_prefill.py                 # DeepSeek-V3 widths, one layer's attention, bf16, CUDA
    python benchmarks/mla_prefill.py --tiny --device cpu   # small widths: the equivalence check alone

Both start from what the layer has after its projections — per-head queries (128 nope + 64 rope dims) and the
token's latent row (512 compressed + 64 rope) — and end at the per-head outputs (128 dims) before o_proj:
- absorbed: queries taken into the latent space (q_nope·W_UK, per head: 576 wide), attention over one KV head
  of latent rows (keys 576, values their first 512), then W_UV per head. Reads 576 values per cached token.
- expanded: each token's latent multiplied out to per-head keys (128 + the shared 64 rope) and values (128),
  then causal attention of 128 heads × 192 / 128 — flash-capable head dims, 40 960 values per token.
- pcg fresh: pcg_core/attention/mla_op.py's expanded form as a fresh prefill runs it, on FlashAttention-2's varlen
  kernel (the values padded to the keys' 192) and on torch's memory-efficient one (values at 128): fresh.py's
  FRESH_KERNEL; issue 38's target is ≤ 1.2× expanded at 2048 tokens.
Prefill of one fresh sequence (causal, nothing cached), medians of CUDA-event timings after warm-up; decode is
always absorbed (it reads the cache, where expanding every step would cost the whole context). The results
are checked to agree (float32: 1e-4 relative; bf16: 2e-2), so the comparison is of the same function.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from harness.cell.timing import median_ms
from pcg_core.attention.fresh import FreshKernel
from pcg_core.attention.metadata import AttentionMetadata
from pcg_core.attention.mla_op import expanded_attention

WIDTHS = {"heads": 128, "nope": 128, "rope": 64, "rank": 512, "v": 128}
TINY = {"heads": 4, "nope": 16, "rope": 8, "rank": 32, "v": 16}


def _inputs(t: int, w: dict, dtype: torch.dtype, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    x = {
        "q_nope": rnd(t, w["heads"], w["nope"]), "q_rot": rnd(t, w["heads"], w["rope"]),
        "c": rnd(t, w["rank"]), "k_rot": rnd(t, w["rope"]),
        "w_uk": rnd(w["heads"], w["nope"], w["rank"], scale=w["rank"] ** -0.5),
        "w_uv": rnd(w["heads"], w["v"], w["rank"], scale=w["rank"] ** -0.5),
    }
    # what pcg's op is handed (the model holds them so): kv_b_proj's weight per head, keys' rows then values', and
    # the latent row the cache keeps
    x["w_kv"] = torch.cat([x["w_uk"], x["w_uv"]], dim=1)
    x["rows"] = torch.cat([x["c"], x["k_rot"]], dim=-1)
    return x


def absorbed(x: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """[T, H, v]: attention in the latent space, one KV head (SDPA with the KV head broadcast to every query head)."""
    t, h = x["q_nope"].shape[:2]
    rank = x["c"].shape[-1]
    query = torch.cat([torch.einsum("thn,hnr->thr", x["q_nope"], x["w_uk"]), x["q_rot"]], dim=-1)  # [T, H, 576]
    latent = torch.cat([x["c"], x["k_rot"]], dim=-1)  # [T, 576]
    keys = latent[None, None].expand(1, h, t, latent.shape[-1])
    values = latent[None, None, :, :rank].expand(1, h, t, rank)
    o = F.scaled_dot_product_attention(query.transpose(0, 1)[None], keys, values, is_causal=True, scale=scale)
    return torch.einsum("thr,hvr->thv", o[0].transpose(0, 1), x["w_uv"])


def expanded(x: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """[T, H, v]: per-head keys and values multiplied out of the latent, ordinary causal attention."""
    t, h = x["q_nope"].shape[:2]
    k_nope = torch.einsum("tr,hnr->thn", x["c"], x["w_uk"])
    v = torch.einsum("tr,hvr->thv", x["c"], x["w_uv"])
    k = torch.cat([k_nope, x["k_rot"][:, None].expand(t, h, x["k_rot"].shape[-1])], dim=-1)
    q = torch.cat([x["q_nope"], x["q_rot"]], dim=-1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, scale=scale)
    return o[0].transpose(0, 1)


def pcg_fresh(x: dict[str, torch.Tensor], scale: float, kernel: FreshKernel = "flash") -> torch.Tensor:
    """[T, H, v]: what pcg's split op runs for a fresh prefill (pcg_core/attention/mla_op.py: the expansion, then
    FlashAttention-2 over the sequence's own rows on CUDA), one sequence of T tokens."""
    t = x["c"].shape[0]
    dev = x["c"].device
    md = AttentionMetadata(t, t, torch.zeros(t, dtype=torch.int64, device=dev), torch.arange(t, device=dev),
                           torch.zeros(t, dtype=torch.int32, device=dev), torch.ones(t, dtype=torch.bool, device=dev))
    return expanded_attention(x["q_nope"], x["q_rot"], x["rows"], x["w_kv"], md, scale, kernel)


def pcg_fresh_efficient(x: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """pcg_fresh on torch's memory-efficient varlen kernel (pcg_core/attention/fresh.py: FRESH_KERNEL)."""
    return pcg_fresh(x, scale, "efficient")


def measure(tokens: list[int], w: dict, dtype: torch.dtype, device: str, repeat: int,
            profile_at: int | None = None) -> list[dict]:
    scale = (w["nope"] + w["rope"]) ** -0.5
    rows = []
    for t in tokens:
        x = _inputs(t, w, dtype, device)
        cuda = device.startswith("cuda")
        outs = [absorbed(x, scale), pcg_fresh(x, scale)] + ([pcg_fresh_efficient(x, scale)] if cuda else [])
        e = expanded(x, scale)
        rel = max(float((o.float() - e.float()).norm() / e.float().norm()) for o in outs)
        row = {"tokens": t, "rel_diff": rel}
        if t == profile_at and device.startswith("cuda"):  # where the GPU time goes, kernel by kernel
            from benchmarks.prefill import profile_forward

            row["profile"] = {name: profile_forward(lambda fn=fn: fn(x, scale), torch.device(device))
                              for name, fn in (("expanded", expanded), ("pcg_fresh", pcg_fresh),
                                               ("pcg_fresh_efficient", pcg_fresh_efficient))}
        if device.startswith("cuda"):
            row["absorbed_ms"] = median_ms(lambda: absorbed(x, scale), torch.device(device), warmup=3, repeat=repeat)
            row["expanded_ms"] = median_ms(lambda: expanded(x, scale), torch.device(device), warmup=3, repeat=repeat)
            row["pcg_fresh_ms"] = median_ms(lambda: pcg_fresh(x, scale), torch.device(device), warmup=3, repeat=repeat)
            row["pcg_fresh_efficient_ms"] = median_ms(lambda: pcg_fresh_efficient(x, scale), torch.device(device),
                                                      warmup=3, repeat=repeat)
            row["absorbed/expanded"] = row["absorbed_ms"] / row["expanded_ms"]
            row["pcg_fresh/expanded"] = row["pcg_fresh_ms"] / row["expanded_ms"]
            row["pcg_fresh_efficient/expanded"] = row["pcg_fresh_efficient_ms"] / row["expanded_ms"]
        row["values_read_per_token"] = {"absorbed": w["rank"] + w["rope"],
                                        "expanded": w["heads"] * (w["nope"] + w["rope"] + w["v"])}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="small widths (the equivalence check on a CPU)")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--tokens", type=int, nargs="+", default=None)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--profile", type=int, default=None, metavar="TOKENS",
                   help="also print the GPU kernels of expanded and pcg fresh at this token count")
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32"))
    tokens = a.tokens or ([16, 64] if a.tiny else [64, 128, 512, 2048, 4096])
    rows = measure(tokens, TINY if a.tiny else WIDTHS, dtype, a.device, a.repeat, a.profile)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    def mark(r: dict, k: str) -> str:
        return f" (issue 38: ≤ 1.2 {'✓' if r[k] <= 1.2 else '✗'})" if r["tokens"] == 2048 else ""

    for r in rows:
        ms = (f"absorbed {r['absorbed_ms']:.3f} ms, expanded {r['expanded_ms']:.3f} ms, pcg fresh flash "
              f"{r['pcg_fresh_ms']:.3f} ms / efficient {r['pcg_fresh_efficient_ms']:.3f} ms; absorbed/expanded "
              f"{r['absorbed/expanded']:.2f}, pcg fresh/expanded flash {r['pcg_fresh/expanded']:.2f}"
              f"{mark(r, 'pcg_fresh/expanded')} / efficient {r['pcg_fresh_efficient/expanded']:.2f}"
              f"{mark(r, 'pcg_fresh_efficient/expanded')}"
              if "absorbed_ms" in r else "not timed (CPU)")
        print(f"{r['tokens']:>6} tokens: {ms}; relative difference {r['rel_diff']:.2e}")
        if not r["rel_diff"] <= tol:
            raise SystemExit(f"absorbed and expanded differ by {r['rel_diff']:.3g} > {tol:g} at {r['tokens']} tokens")
    for r in rows:
        for name, prof in r.get("profile", {}).items():
            print(f"\n{r['tokens']} tokens, {name}: {prof['kernels']} kernels, {prof['gpu_ms']:.3f} GPU ms")
            for k in prof["top"]:
                print(f"  {k['us']:9.1f} us  ×{k['count']:<3} {k['name']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
