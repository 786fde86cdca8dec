#!/usr/bin/env bash
# What 2026-12-05 (c) added on CPU and has never run on CUDA, in one device call (carry .whl):
#   tests — the GPU tests of the new code: TP's world of one over NCCL (the all-reduce eager between piecewise and
#           breakable graphs, captured inside full's graph, each bitwise equal to eager) and Qwen3-Next's
#           linear-attention op on CUDA
#   next  — Qwen3-Next's cells at 4 layers (lists/issue39-next-cells.txt), 4 at a time
#   vlm   — the VLMs' cells (lists/issue39-vlm-cells.txt), 4 at a time
# Usage on the GPU machine: bash benchmarks/gpu_new.sh [tests] [next] [vlm]   (default: tests next)
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests next}
here=$(dirname "$0")
if [[ " $phases " == *" tests "* ]]; then
  timeout 300 python3 -m pytest -q -m gpu tests/pcg_core/distributed/test_tp_gpu.py tests/pcg_core/linear_attention/test_qwen3_next_gpu.py \
    2>&1 | tee "$OUT/new_gpu_tests.txt" | tail -8
fi
if [[ " $phases " == *" next "* ]]; then
  NAME=next CELL_JOBS=4 LIST_TIMEOUT=${LIST_TIMEOUT:-420} bash "$here/gpu_cells.sh" "$here/lists/issue39-next-cells.txt"
fi
if [[ " $phases " == *" vlm "* ]]; then
  NAME=vlm CELL_JOBS=4 LIST_TIMEOUT=${LIST_TIMEOUT:-540} bash "$here/gpu_cells.sh" "$here/lists/issue39-vlm-cells.txt"
fi
