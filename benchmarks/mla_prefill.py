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
- pcg fresh: pcg_core/attention/mla_op.py's expanded form as a fresh prefill runs it: the packed path on each of
  fresh.py's FRESH_KERNEL choices — FlashAttention-2's varlen kernel (the values padded to the keys' 192) and torch's
  memory-efficient one (values at 128) — with the engine's bounds of FRESH_PATH_MAX_SEQS sequence slots,
  FlashAttention-2 with one slot (what the empty slots cost), and the one-sequence path (fresh_path "one": dense
  causal attention, cuDNN's kernel first), which is what the engine takes for a forward of one sequence, as here;
  issue 38's target is ≤ 1.2× expanded at 2048 tokens. A kernel that fails on this GPU or torch is reported.
Prefill of one fresh sequence (causal, nothing cached), medians of CUDA-event timings after warm-up; decode is
always absorbed (it reads the cache, where expanding every step would cost the whole context). The results
are checked to agree (float32: 1e-4 relative; bf16: 2e-2), so the comparison is of the same function.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from harness.cell.timing import median_ms
from pcg_core.attention.fresh import FRESH_PATH_MAX_SEQS, FreshKernel, sequence_bounds
from pcg_core.attention.metadata import AttentionMetadata, FreshPath
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


def fresh_metadata(t: int, device: str, max_seqs: int = FRESH_PATH_MAX_SEQS,
                   path: FreshPath = "packed") -> AttentionMetadata:
    """One sequence of t tokens, its bounds built once as the engine builds them with the upload (fresh_bounds).
    max_seqs: the sequence slots of the bounds (the engine's FRESH_PATH_MAX_SEQS); each slot is a column of blocks
    in FlashAttention-2's and the memory-efficient kernel's grid, empty past the batch's sequences."""
    seq = torch.zeros(t, dtype=torch.int32, device=device)
    return AttentionMetadata(t, t, torch.zeros(t, dtype=torch.int64, device=device), torch.arange(t, device=device),
                             seq, torch.ones(t, dtype=torch.bool, device=device),
                             fresh_path=path, fresh_bounds=sequence_bounds(seq, max_seqs))


def pcg_fresh(kernel: FreshKernel, max_seqs: int = FRESH_PATH_MAX_SEQS,
              path: FreshPath = "packed") -> Callable[[dict, float], torch.Tensor]:
    """What pcg's split op runs for a fresh prefill (pcg_core/attention/mla_op.py: the expansion, then the fresh
    kernel over the sequence's own rows on CUDA), one sequence of T tokens: the packed path on one of FRESH_KERNEL's
    kernels, or the one-sequence path (path "one": the kernel unused)."""

    built: dict[tuple[int, str], AttentionMetadata] = {}  # once per shape, outside the timed calls (the engine's)

    def run(x: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
        t, device = x["c"].shape[0], str(x["c"].device)
        if (t, device) not in built:
            built[t, device] = fresh_metadata(t, device, max_seqs, path)
        md = built[t, device]
        return expanded_attention(x["q_nope"], x["q_rot"], x["rows"], x["w_kv"], md, scale, kernel)

    return run


# The forms timed, by name: pcg's packed fresh path on each kernel with the engine's bounds, FlashAttention-2 with
# the bounds of one sequence slot (what the empty slots of the engine's bounds cost, measured rather than guessed),
# and the one-sequence path the engine takes for this forward.
FORMS: dict[str, Callable[[dict, float], torch.Tensor]] = {
    "absorbed": absorbed, "expanded": expanded,
    "pcg fresh flash": pcg_fresh("flash"), "pcg fresh efficient": pcg_fresh("efficient"),
    "pcg fresh flash, 1 slot": pcg_fresh("flash", 1), "pcg fresh one": pcg_fresh("flash", path="one"),
}
CPU_FORMS = ("absorbed", "expanded", "pcg fresh flash", "pcg fresh one")  # off CUDA the packed path is masked SDPA


def measure(tokens: list[int], w: dict, dtype: torch.dtype, device: str, repeat: int,
            profile_at: int | None = None) -> list[dict]:
    """Per token count: each form's median ms and its ratio to expanded (CUDA), the largest relative difference
    of any form from expanded, and a form that fails to run (a kernel this GPU or torch refuses) with its error."""
    scale = (w["nope"] + w["rope"]) ** -0.5
    cuda = device.startswith("cuda")
    rows = []
    for t in tokens:
        x = _inputs(t, w, dtype, device)
        e = expanded(x, scale)
        row: dict = {"tokens": t, "ms": {}, "ratio": {}, "errors": {}, "rel_diff": 0.0}
        for name in FORMS if cuda else CPU_FORMS:
            try:
                o = e if name == "expanded" else FORMS[name](x, scale)  # the one every form is compared with
            except RuntimeError as err:  # recorded and shown: the other forms still run
                row["errors"][name] = str(err).splitlines()[0][:200]
                continue
            row["rel_diff"] = max(row["rel_diff"], float((o.float() - e.float()).norm() / e.float().norm()))
            if cuda:
                row["ms"][name] = median_ms(partial(FORMS[name], x, scale), torch.device(device), warmup=3,
                                            repeat=repeat)
        if cuda:
            row["ratio"] = {k: v / row["ms"]["expanded"] for k, v in row["ms"].items()}
        if t == profile_at and cuda:  # where the GPU time goes, kernel by kernel
            from benchmarks.prefill import profile_forward

            row["profile"] = {name: profile_forward(partial(FORMS[name], x, scale), torch.device(device))
                              for name in row["ms"] if name != "absorbed"}
        row["values_read_per_token"] = {"absorbed": w["rank"] + w["rope"],
                                        "expanded": w["heads"] * (w["nope"] + w["rope"] + w["v"])}
        rows.append(row)
    return rows


def _print(rows: list[dict]) -> None:
    """One table: forms as columns, ms with the ratio to expanded, issue 38's target marked at 2048 tokens."""
    names = [n for n in FORMS if any(n in r["ms"] for r in rows)]
    if names:
        print("tokens | " + " | ".join(names))
        for r in rows:
            cells = []
            for n in names:
                if n not in r["ms"]:
                    cells.append("failed" if n in r["errors"] else "-")
                    continue
                mark = ""
                if r["tokens"] == 2048 and n.startswith("pcg fresh"):
                    mark = " ✓" if r["ratio"][n] <= 1.2 else " ✗"  # issue 38: ≤ 1.2× expanded
                cells.append(f"{r['ms'][n]:.3f} ({r['ratio'][n]:.2f}×{mark})")
            print(f"{r['tokens']:>6} | " + " | ".join(cells))
    for r in rows:
        print(f"{r['tokens']:>6} tokens: largest relative difference from expanded {r['rel_diff']:.2e}"
              + "".join(f"; {n} failed: {err}" for n, err in r["errors"].items()))


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
    _print(rows)
    for r in rows:
        if not r["rel_diff"] <= tol:
            raise SystemExit(f"a form differs from expanded by {r['rel_diff']:.3g} > {tol:g} at {r['tokens']} tokens")
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
