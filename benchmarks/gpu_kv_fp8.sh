#!/usr/bin/env bash
# Issue 37 (b) on the device: the FP8 KV cache's nightly cells at trims, judged (graph = eager bitwise at the same
# padding; the reference layer against transformers with K/V rounded to FP8), and their latency beside the same
# cells with the 16-bit KV cache. Phases (default all): tests fp8 auto table
#   tests — pytest -m gpu tests/pcg_core/attention/test_kv_cache_fp8.py (every backend × capture backend, replay = eager bitwise)
#   fp8   — benchmarks/lists/kv-fp8.txt (the nightly's kv_fp8 tier: 18 cells) through gpu_cells.sh
#   auto  — the same cells with kv_cache auto
#   table — one row per cell: both statuses, the same-padding difference, the reference layer, KV bytes per token and
#           graph latency at each token count, FP8 beside 16-bit
# Each of fp8 and auto fits one device call of 600 s at CELL_JOBS=6 (18 cells of ≤ 4 layers); run them as separate
# calls (`bash benchmarks/gpu_kv_fp8.sh fp8`, then `… auto table`), carrying $OUT's kv_fp8.jsonl back for the table.
# Carry .whl (pydantic, SQLAlchemy: benchmarks/gpu_nightly.sh says how to fetch them).
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests fp8 auto table}
here=$(dirname "$0")
if [[ " $phases " == *" tests "* ]]; then
  timeout 240 python3 -m pytest -q -m gpu tests/pcg_core/attention/test_kv_cache_fp8.py 2>&1 | tee "$OUT/kv_fp8_tests.txt" | tail -8
fi
if [[ " $phases " == *" fp8 "* ]]; then
  NAME=kv_fp8 CELL_JOBS=${CELL_JOBS:-6} LIST_TIMEOUT=${LIST_TIMEOUT:-540} bash "$here/gpu_cells.sh" "$here/lists/kv-fp8.txt" | tail -22
fi
if [[ " $phases " == *" auto "* ]]; then
  sed 's/ fp8_e4m3$/ auto/' "$here/lists/kv-fp8.txt" > /tmp/kv-auto.txt
  NAME=kv_auto CELL_JOBS=${CELL_JOBS:-6} LIST_TIMEOUT=${LIST_TIMEOUT:-540} bash "$here/gpu_cells.sh" /tmp/kv-auto.txt | tail -22
fi
if [[ " $phases " == *" table "* ]]; then
  python3 "$here/kv_fp8_table.py" "${FP8_JSONL:-$OUT/kv_fp8.jsonl}" "${AUTO_JSONL:-$OUT/kv_auto.jsonl}" | tee "$OUT/kv_fp8.md"
fi
