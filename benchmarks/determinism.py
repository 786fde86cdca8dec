"""Probe eager determinism on a device: run the cell's prompt suite twice on one eager engine, name the cases
that differ, then find the first module whose output differs between two forwards of the same batch, under
each SDPA kernel choice. Used to explain an `eager_nondeterministic` status.

    python benchmarks/determinism.py --model qwen3-0.6b --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import warnings

import torch

from harness.cell import CellSpec, resolve_model
from harness.cell.prompts import prompt_suite
from pcg_core import CaptureConfig, Engine, EngineConfig, load_model


def module_outputs(engine: Engine, batch) -> dict[str, torch.Tensor]:
    outs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in engine.decoder.named_modules():
        if name.count(".") <= 3 and name:
            hooks.append(mod.register_forward_hook(
                lambda m, a, o, name=name: outs.__setitem__(name, (o[0] if isinstance(o, tuple) else o).detach().clone())))
    try:
        engine.forward(batch)
    finally:
        for h in hooks:
            h.remove()
    return outs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-tokens", type=int, default=4096)
    args = ap.parse_args()
    spec = CellSpec(model=args.model, graph="piecewise", device=args.device, layers=args.layers, max_tokens=args.max_tokens)
    lm = load_model(resolve_model(spec), layers=args.layers, weights="synthetic", dtype=torch.bfloat16, device=args.device)
    cap = CaptureConfig(backend="disabled", max_tokens=args.max_tokens)
    cases = {c.name: [list(p) for p in c.prompts] for c in prompt_suite(cap.ladder, lm.config.vocab_size)}
    kv = max(sum(len(p) + 8 for p in ps) for ps in cases.values()) + 16
    engine = Engine(lm.model, EngineConfig(device=args.device, dtype="bfloat16", capture=cap, kv_slots=kv))
    # Cold versus warm: the first forward at a shape against later ones, module by module.
    for name, prompts in cases.items():
        batch = engine.prefill_batch(prompts)
        outs = [module_outputs(engine, batch) for _ in range(3)]
        for i in (1, 2):
            first = next((k for k in outs[0] if not torch.equal(outs[0][k], outs[i][k])), None)
            print(f"  {name} forward 1 vs {i + 1}: " + ("identical" if first is None else f"first differing module: {first}, "
                  f"max|Δ| {(outs[0][first].float() - outs[i][first].float()).abs().max().item():.3g}"))
    runs = [{n: engine.generate(ps, 8, 5, prompt_logprobs=True) for n, ps in cases.items()} for _ in range(3)]
    for name in cases:
        print(f"case {name:24s} run1==run2 {runs[0][name] == runs[1][name]} run2==run3 {runs[1][name] == runs[2][name]}")
    finite = all(bool(torch.isfinite(t).all()) for t in engine.cache.k + engine.cache.v)
    print(f"KV cache all finite after the runs: {finite}")
    zeroed = []
    for _ in range(2):
        for t in engine.cache.k + engine.cache.v:
            t.zero_()
        zeroed.append({n: engine.generate(ps, 8, 5, prompt_logprobs=True) for n, ps in cases.items()})
    for name in cases:
        print(f"case {name:24s} with K/V zeroed before each run: identical {zeroed[0][name] == zeroed[1][name]}, "
              f"equal to run 1 {zeroed[0][name] == runs[0][name]}")
    for name in cases:
        same = runs[0][name] == runs[1][name]
        worst = 0.0
        for a, b in zip(runs[0][name], runs[1][name]):
            worst = max([worst] + [abs(x - y) for x, y in zip(a.prompt_logprobs + a.output_logprobs, b.prompt_logprobs + b.output_logprobs)])
        print(f"case {name:24s} identical={same} max|Δlogprob|={worst:.3g}")
    # Which ops does torch itself call nondeterministic here?
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.forward(engine.prefill_batch(cases[next(iter(cases))]))
    torch.use_deterministic_algorithms(False)
    print("ops torch flags as nondeterministic:", sorted({str(w.message)[:100] for w in caught}) or "none")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"default": None, "math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}
    for name, prompts in cases.items():
        batch = engine.prefill_batch(prompts)
        for kname, kernel in kernels.items():
            try:
                with sdpa_kernel([kernel]) if kernel is not None else contextlib.nullcontext():
                    outs = [module_outputs(engine, batch) for _ in range(4)]
            except RuntimeError as e:
                print(f"  {name} kernel={kname}: not available ({str(e)[:80]})")
                continue
            first = None
            for key in outs[0]:
                if any(not torch.equal(outs[0][key], o[key]) for o in outs[1:]):
                    first = key
                    break
            print(f"  {name} kernel={kname}: " + ("deterministic" if first is None else f"first differing module: {first}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
