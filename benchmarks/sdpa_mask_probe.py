"""Does torch SDPA ignore masked keys exactly? For each SDPA kernel, attention over a key set where only the
first n keys are visible is computed twice — masked keys holding zeros, then holding random values — and
against a float32 reference over the visible keys alone. Our `sdpa` backend attends over the whole KV cache
with a mask, so it relies on masked keys contributing exactly nothing.

    python benchmarks/sdpa_mask_probe.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.cell.timing import median_ms


def main() -> int:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    heads, dim, slots = 16, 128, 4121
    kernels = {"default": None, "math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}
    for q_len, n_visible in ((1, 177), (176, 176), (8, 4000)):
        q = torch.randn(1, heads, q_len, dim, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, heads, slots, dim, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, heads, slots, dim, device=dev, dtype=torch.bfloat16)
        pos = torch.arange(n_visible - q_len, n_visible, device=dev)
        mask = torch.zeros(q_len, slots, dtype=torch.bool, device=dev)
        mask[:, :n_visible] = torch.arange(n_visible, device=dev)[None, :] <= pos[:, None]
        ref = F.scaled_dot_product_attention(q.float()[..., :, :], k.float()[:, :, :n_visible], v.float()[:, :, :n_visible],
                                             attn_mask=mask[None, None, :, :n_visible])
        k0, v0 = k.clone(), v.clone()
        k0[:, :, n_visible:] = 0
        v0[:, :, n_visible:] = 0
        for name, kern in kernels.items():
            try:
                with sdpa_kernel([kern]) if kern is not None else torch.autograd.grad_mode.no_grad():
                    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
                    b = F.scaled_dot_product_attention(q, k0, v0, attn_mask=mask[None, None])
            except RuntimeError as e:
                print(f"q={q_len:4d} visible={n_visible:5d} {name:9s}: unavailable ({str(e)[:60]})")
                continue
            with sdpa_kernel([kern]) if kern is not None else torch.autograd.grad_mode.no_grad():
                repeats = [F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None]) for _ in range(30)]
                ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None]), torch.device(dev))
            same = all(torch.equal(repeats[0], r) for r in repeats[1:])
            print(f"q={q_len:4d} visible={n_visible:5d} {name:9s}: masked keys change output by "
                  f"{(a.float() - b.float()).abs().max().item():.3g}; vs fp32 reference {(a.float() - ref).abs().max().item():.3g}; "
                  f"30 repeats bitwise equal: {same}; {ms:.3f} ms")
    # GEMMs at decode shapes (one row): run-to-run bitwise?
    for m, kk, nn in ((1, 1024, 3072), (1, 1024, 151936), (4, 2048, 768), (176, 1024, 6144)):
        x = torch.randn(m, kk, device=dev, dtype=torch.bfloat16)
        w = torch.randn(nn, kk, device=dev, dtype=torch.bfloat16)
        outs = [F.linear(x, w) for _ in range(50)]
        print(f"linear M={m} K={kk} N={nn}: 50 repeats bitwise equal: {all(torch.equal(outs[0], o) for o in outs[1:])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
