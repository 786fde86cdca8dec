#!/usr/bin/env bash
# One device call for the attention backends (issue 11): phases, default all.
#   tests  — pytest -m gpu on the attention tests (and the rest of pcg_core's GPU tests with `tests all`)
#   micro  — benchmarks/attention.py: each backend vs SDPA-flash, per layer
#   bench  — benchmarks/prefill.py, Qwen3-0.6B shape, bf16: {sdpa, flex, varlen} × {full, piecewise:inductor}
#            and reduce-overhead, side by side (PREFILL_ARGS adds or overrides arguments)
#   cells  — `pcgh cell` on CUDA for the supported architectures × {sdpa, flex, varlen} × graph modes
# Usage on the GPU machine, from the repo root: bash benchmarks/gpu_attention.sh [tests] [micro] [bench] [cells] (in that
# order or any other: phases run as listed)
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests micro bench}
tests() {
  files=tests/pcg_core/attention/test_attention_backends.py
  [[ " $phases " == *" all "* ]] && files=tests/pcg_core
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu -x $files 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
}
micro() {
  timeout 120 python3 benchmarks/attention.py --json "$OUT/attention.json" 2>&1 | tee "$OUT/attention.txt" | tail -12
}
bench() {
  timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/prefill.py --model harness/models/configs/Qwen__Qwen3-0.6B.json --dtype bfloat16 \
    --tokens 8,128,512,2048 --reduce-overhead \
    --configs ${PREFILL_CONFIGS:-sdpa/full,varlen/full,flex/full,varlen/piecewise:inductor,flex/piecewise:inductor} \
    --json "$OUT/prefill_attention.json" ${PREFILL_ARGS:-} 2>&1 | tee "$OUT/prefill_attention.txt" | tail -30
}
cells() {
  # One line per cell, run ${CELL_JOBS:-6} at a time on the one GPU (each is small; compiling is CPU work).
  : > "$OUT/cells.jsonl"
  for spec in ${CELLS:-qwen3-0.6b:tiny qwen2.5-0.5b:tiny llama-3.1-8b:tiny qwen3-30b-a3b:tiny mixtral-8x7b:tiny}; do
    for attention in sdpa flex varlen; do
      for graph in piecewise breakable full; do echo "$spec $attention $graph"; done
    done
  done | xargs -P ${CELL_JOBS:-6} -L 1 bash -c '
    model=${0%%:*}; layers=${0##*:}
    if [[ $layers == tiny ]]; then size=(--tiny); else size=(--layers "$layers"); fi
    out=$(timeout --foreground -k 30 ${CELL_TIMEOUT:-300} python3 -m harness.cli cell --model "$model" "${size[@]}" --attention "$1" --graph "$2" \
      --device cuda --max-tokens ${CELL_MAX_TOKENS:-256} --json 2>> "$OUT/cells.err")
    [[ -n $out ]] && echo "$out" >> "$OUT/cells.jsonl"; true'
  python3 benchmarks/cells_table.py "$OUT/cells.jsonl" | tee "$OUT/cells.md"
}
for phase in $phases; do [[ $phase == all ]] || $phase; done
