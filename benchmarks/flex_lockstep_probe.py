"""Where a graph and eager part at the same padding (issue 11's Llama-3.1-8B flex full/breakable cells).

Runs one cell's engines as run_cell builds them, then one case in lockstep with every attention call recorded on
both sides: its query, its output, the block mask it got and the KV cache after the step. Also runs the graph
engine's own eager forward at the same padding, which tells an engine-instance difference (cache, compiled
kernel) from a graph-vs-eager one. A second section records each decoder GEMM's shape eager, on a side stream
and replayed from a CUDA graph, bitwise.

    python3 benchmarks/flex_lockstep_probe.py --model llama-3.1-8b --layers 4 --graph breakable --case above_max_257
"""

from __future__ import annotations

import argparse
import json

import torch

from harness.cell.judge.lockstep import lockstep
from harness.cell.run import _Cell, _candidate, _check_runtime, _eager_reference, _load, recorded_settings
from harness.cell.spec import CellSpec
from pcg_core.attention.flex import FlexBackend
from pcg_core.config import CaptureConfig, EngineConfig


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30))


def probe_cell(args) -> list[dict]:
    spec = CellSpec(model=args.model, layers=args.layers, graph=args.graph, attention="flex", device=args.device,
                    tiny=args.tiny, max_tokens=args.max_tokens, compiler=args.compiler)
    capture = CaptureConfig(backend=spec.graph, compiler=spec.compiler, max_tokens=spec.max_tokens)
    cell = _Cell(spec, EngineConfig(device=args.device, dtype=spec.dtype, attention="flex", capture=capture),
                 recorded_settings(spec))
    _check_runtime(spec)
    _load(cell)
    eager, _ = _eager_reference(cell)
    graph, _ = _candidate(cell, lambda p: None)
    case = next(c for c in cell.cases if c.name == args.case)

    seen: dict[int, dict[int, dict]] = {}  # id(backend) → layer → what the call saw
    orig = FlexBackend.forward

    def forward(self, q, k, v, out, params, md):
        orig(self, q, k, v, out, params, md)
        n = md.num_tokens
        bm = self._masks.get(params.sliding_window)
        seen.setdefault(id(self), {})[params.layer] = {
            "slots": md.slot_mapping[:n].long().clone(), "q": q[:n].float().clone(), "out": out[:n].float().clone(), "n": n,
            "mask": [t.clone() for t in (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices)]
            if bm is not None else None,
            "kernels": sorted(str(key) for key in self._kernels)}

    FlexBackend.forward = forward
    rows, written = [], None
    try:
        for i, step in enumerate(lockstep(eager, graph, case)):
            if i >= args.steps:
                break
            ref_calls = dict(seen.pop(id(eager.attn_backend), {}))
            cand_calls = dict(seen.pop(id(graph.attn_backend), {}))
            if ref_calls:
                new = ref_calls[min(ref_calls)]["slots"]
                written = new if written is None else torch.cat([written, new]).unique()
            row = {"step": step.label, "hidden_rel": _rel(step.ref, step.cand), "layers": []}
            for layer in sorted(ref_calls):
                r, c = ref_calls[layer], cand_calls.get(layer)
                entry = {"layer": layer}
                if c is not None:
                    entry["q_rel"] = _rel(r["q"], c["q"])
                    entry["out_rel"] = _rel(r["out"], c["out"])
                    if r["mask"] is not None and c["mask"] is not None:
                        entry["mask_equal"] = all(torch.equal(a, b) for a, b in zip(r["mask"], c["mask"]))
                        if not entry["mask_equal"] or args.verbose:
                            entry["mask_ref"] = [t.flatten()[:8].tolist() for t in r["mask"]]
                            entry["mask_cand"] = [t.flatten()[:8].tolist() for t in c["mask"]]
                ce, cg = eager.cache, graph.cache
                entry["k_cache_equal"] = torch.equal(ce.k[layer][written], cg.k[layer][written])  # the case's slots so far
                entry["v_cache_equal"] = torch.equal(ce.v[layer][written], cg.v[layer][written])
                row["layers"].append(entry)
            row["ref_kernels"] = ref_calls[min(ref_calls)]["kernels"] if ref_calls else []
            row["cand_kernels"] = cand_calls[min(cand_calls)]["kernels"] if cand_calls else []
            rows.append(row)
            print(_line(row), flush=True)
    finally:
        FlexBackend.forward = orig
    return rows


def _line(row: dict) -> str:
    parts = [f"{row['step']}: hidden {row['hidden_rel']:.3g}"]
    for e in row["layers"]:
        parts.append(f"L{e['layer']} q {e.get('q_rel', float('nan')):.3g} out {e.get('out_rel', float('nan')):.3g} "
                     f"mask {'=' if e.get('mask_equal', True) else '≠'} kv {'=' if e['k_cache_equal'] and e['v_cache_equal'] else '≠'}")
    return " | ".join(parts)


def probe_gemms(m_values=(1, 2, 4, 8), shapes=((4096, 6144), (4096, 4096), (4096, 14336), (14336, 4096))) -> list[dict]:
    """Each (M, K→N) bf16 linear eager on the default stream, on a side stream, and replayed from a graph."""
    torch.manual_seed(0)
    out = []
    for k, n in shapes:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in m_values:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, w)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                side = torch.nn.functional.linear(x, w)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s):
                    y = torch.nn.functional.linear(x, w)
            torch.cuda.current_stream().wait_stream(s)
            g.replay()
            torch.cuda.synchronize()
            row = {"m": m, "k": k, "n": n, "side_equal": torch.equal(ref, side), "graph_equal": torch.equal(ref, y),
                   "graph_rel": _rel(ref, y)}
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--graph", default="breakable")
    p.add_argument("--compiler", default="eager")
    p.add_argument("--case", default="above_max_257")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny widths (a CPU check of the probe itself)")
    p.add_argument("--gemms", action="store_true", help="only the GEMM section")
    p.add_argument("--json")
    args = p.parse_args()
    result = {"gemms": probe_gemms() if args.device == "cuda" else []}
    if not args.gemms:
        result["cell"] = probe_cell(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
