#!/usr/bin/env bash
# One device call: environment, then the phases asked for (default: all).
#   tests  — pytest -m gpu
#   cells  — `pcgh cell` on CUDA for the supported seed architectures × graph backends (JSON lines)
#   bench  — benchmarks/prefill.py for a Qwen3-0.6B shape and a trimmed Qwen3-30B-A3B shape, bf16
# Usage (on the GPU machine, from the repo root): bash benchmarks/gpu_run.sh [tests] [cells] [bench]
# The cells phase reads the outcome type (pydantic), which the GPU image lacks: carry the wheels in .whl as
# benchmarks/gpu_nightly.sh says.
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests cells bench}
if [[ " $phases " == *" tests "* ]]; then
  # The GPU tests live with the runtime's; the harness and web suites import pydantic/fastapi, absent on the image.
  timeout 200 python3 -m pytest -q -m gpu tests/pcg_core 2>&1 | tee "$OUT/gpu_tests.txt" | tail -15
fi
if [[ " $phases " == *" cells "* ]]; then
  : > "$OUT/cells.jsonl"
  while read -r model layers graph; do
    timeout 150 python3 -m harness.cli cell --model "$model" --layers "$layers" --graph "$graph" --device cuda --json \
      >> "$OUT/cells.jsonl" 2>> "$OUT/cells.err" || true
  done <<CELLS
qwen3-0.6b 28 piecewise
qwen3-0.6b 28 breakable
qwen3-0.6b 28 full
qwen3-30b-a3b 4 piecewise
mixtral-8x7b 2 piecewise
CELLS
  python3 benchmarks/cells_table.py "$OUT/cells.jsonl" | tee "$OUT/cells.md"
fi
if [[ " $phases " == *" bench "* ]]; then
  timeout 280 python3 benchmarks/prefill.py --model harness/models/configs/Qwen__Qwen3-0.6B.json --dtype bfloat16 \
    --json "$OUT/prefill_qwen3_0.6b.json" 2>&1 | tee "$OUT/prefill_qwen3_0.6b.txt"
  timeout 280 python3 benchmarks/prefill.py --model harness/models/configs/Qwen__Qwen3-30B-A3B.json --layers ${MOE_LAYERS:-8} \
    --dtype bfloat16 --json "$OUT/prefill_qwen3_30b_a3b.json" 2>&1 | tee "$OUT/prefill_qwen3_30b_a3b.txt"
fi
