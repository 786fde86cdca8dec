"""Write a synthetic quantized checkpoint in a producer's real on-disk format at a model card's real widths (the
first --layers layers), for `pcgh cell --model DIR --weights real --quant SCHEME`: how the loader's reading of
each format is checked at trimmed real widths on the GPU machine, where nothing is downloaded.

    PYTHONPATH=. python benchmarks/quant_checkpoint.py --model llama-3.1-8b --layers 2 --format awq --scheme awq --out /tmp/ck
    formats: awq, gptq, gptq_v2, compressed-tensors (int4 schemes: pack-quantized, or with --ct-format
    int-quantized W4A8/W4AFP8 as llm-compressor writes them; 8-bit: float/int-quantized), fp8, modelopt,
    w8a8_int8 — the pairs pcg_core.quant.write_checkpoint writes
"""

from __future__ import annotations

import argparse
import time

import torch

from harness.cards import find_card
from pcg_core.model.loader import build_config, shrink_config, synthetic_model
from pcg_core.quant import get_scheme, write_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model card id")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--format", required=True)
    p.add_argument("--scheme", required=True, help="awq, gptq, w4a8, w4afp8 (MoE experts too), or an 8-bit scheme")
    p.add_argument("--ct-format", default="pack-quantized", choices=["pack-quantized", "int-quantized"],
                   help="compressed-tensors' layout of int4 weights (int-quantized: W4A8/W4AFP8, one value per int8)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    card = find_card(args.model)
    if card is None:
        raise SystemExit(f"--model {args.model!r}: no model card of that id (pcgh models lists them)")
    t = time.perf_counter()
    data = shrink_config(dict(card.config), layers=args.layers)
    model = synthetic_model(build_config(data), dtype=torch.bfloat16, device="cpu", seed=args.seed, peaked=True)
    write_checkpoint(model, data, args.out, args.format, get_scheme(args.scheme),
                     **({"ct_format": args.ct_format} if args.ct_format != "pack-quantized" else {}))
    print(f"{args.model} ×{args.layers} as {args.format} ({args.scheme}) → {args.out} in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
