"""Which KV-cache slots influence a generate() call? Fill one region of the cache with garbage before the
call and compare with a zero-filled cache. Only the slots of the call's own sequences may matter."""

from __future__ import annotations

import sys

import torch

from harness.cell import CellSpec, resolve_model
from harness.cell.prompts import prompt_suite
from pcg_core import CaptureConfig, Engine, EngineConfig, load_model


def main() -> int:
    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else None
    spec = CellSpec(model="qwen3-0.6b", device=dev)
    lm = load_model(resolve_model(spec), layers=layers, weights="synthetic", dtype=torch.bfloat16, device=dev)
    cap = CaptureConfig(backend="disabled", max_tokens=max_tokens)
    cases = {c.name: [list(p) for p in c.prompts] for c in prompt_suite(cap.ladder, lm.config.vocab_size)}
    name = next(n for n in cases if "_exact_" in n)
    prompts = cases[name]
    n = len(prompts[0])
    kv = max(sum(len(p) + 8 for p in ps) for ps in cases.values()) + 16
    e = Engine(lm.model, EngineConfig(device=dev, dtype="bfloat16", capture=cap, kv_slots=kv))

    def run(fill_region=None, prompt_lp=True):
        for t in e.cache.k + e.cache.v:
            t.zero_()
            if fill_region is not None:
                t[:, fill_region[0]:fill_region[1]].normal_()
        return e.generate(prompts, 8, 5, prompt_logprobs=prompt_lp)[0]

    base = run()
    print(name, "tokens", base.output_ids)
    print("zeroed twice identical:", run() == base)
    for region in ((0, n), (n, n + 8), (n + 8, kv + 1)):
        o = run(region)
        dp = max(abs(a - b) for a, b in zip(o.prompt_logprobs, base.prompt_logprobs))
        print(f"garbage in slots {region}: outputs identical {o.output_ids == base.output_ids and o.output_logprobs == base.output_logprobs}, "
              f"prompt logprobs max diff {dp:.3g}, tokens {o.output_ids}")
    o = run(prompt_lp=False)
    print("prompt_logprobs=False, zeroed: output identical", o.output_ids == base.output_ids and o.output_logprobs == base.output_logprobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
