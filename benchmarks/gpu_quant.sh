#!/usr/bin/env bash
# One device call for the 8-bit schemes (issue 12): phases, default all.
#   tests  — the kernels against the reference math and under capture (tests/pcg_core/quant/kernels/test_quant_gpu.py)
#   micro  — benchmarks/quant_gemm.py: each scheme vs bf16, 8192×4096, M = 8/64/512/4096, eager and inductor
#   cells  — `pcgh cell` on CUDA: each scheme × Llama, Qwen3, Qwen3-MoE trimmed × {piecewise, breakable, full}
# Usage on the GPU machine, from the repo root: bash benchmarks/gpu_quant.sh [tests] [micro] [cells]
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests micro cells}
tests() {
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/pcg_core/quant/kernels/test_quant_gpu.py 2>&1 | tee "$OUT/gpu_quant_tests.txt" | tail -15
}
micro() {
  timeout ${MICRO_TIMEOUT:-240} python3 benchmarks/quant_gemm.py --compile --json "$OUT/quant_gemm.json" 2>&1 | tee "$OUT/quant_gemm.txt" | tail -14
}
cells() {
  : > "$OUT/quant_cells.jsonl"
  for spec in ${CELLS:-llama-3.1-8b:4 qwen3-8b:4 qwen3-30b-a3b:2}; do
    for quant in ${QUANTS:-fp8_per_tensor fp8_per_token fp8_block int8_w8a8}; do
      for graph in piecewise breakable full; do echo "$spec $quant $graph"; done
    done
  done | xargs -P ${CELL_JOBS:-6} -L 1 bash -c '
    model=${0%%:*}; layers=${0##*:}
    out=$(timeout ${CELL_TIMEOUT:-400} python3 -m harness.cli cell --model "$model" --layers "$layers" --quant "$1" --graph "$2" --compiler ${COMPILER:-eager} \
      --attention ${ATTENTION:-flex} --device cuda --max-tokens ${CELL_MAX_TOKENS:-512} --json 2>> "$OUT/quant_cells.err")
    [[ -n $out ]] && echo "$out" >> "$OUT/quant_cells.jsonl"; true'
  python3 benchmarks/cells_table.py "$OUT/quant_cells.jsonl" | tee "$OUT/quant_cells.md"
}
for phase in $phases; do $phase; done
