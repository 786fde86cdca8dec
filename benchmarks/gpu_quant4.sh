#!/usr/bin/env bash
# One device call for the 4-bit schemes (issue 15): phases, default all. Each phase writes a few files (the device
# brings back only a few per call).
#   tests  — the W4A16 kernels and Int4Linear/Fp4Linear on CUDA vs the reference, under capture (test_quant_gpu.py)
#   micro  — benchmarks/w4a16_gemm.py: bf16 vs awq/gptq layers, 8192×4096, M = 8/64/512/4096, then the threshold scan
#   sweep  — benchmarks/w4a16_gemm.py --sweep: the small-M GEMM configurations (how configs/w4a16_gemm.json is chosen)
#   w4a8   — benchmarks/w4a8_gemm.py: bf16 vs w4a8/w4afp8 at M = 8/64/512/4096, the large-M sweep (configurations ×
#            rescale variants, cuBLASLt's block-scaled FP8), the threshold scan
#   cells  — `pcgh cell` on CUDA, synthetic weights quantized in memory: $QUANTS × $CELLS × {piecewise, breakable, full}
#   ckpt   — checkpoints written in each real format at real widths (benchmarks/quant_checkpoint.py), then
#            `pcgh cell --weights real` on each × {piecewise, breakable}
#   moe    — moe_gemm (the grouped GEMM over quantized experts' codes) and act-order's whole-row activation permute on CUDA
#            (test_quant_gpu.py), then benchmarks/moe_gemm.py: bf16 grouped vs dequantize + grouped vs moe_gemm
#   permute — benchmarks/w4a16_gemm.py --scan-permute: act-order at large M, each way of meeting the permutation
# Usage on the GPU machine, from the repo root: bash benchmarks/gpu_quant4.sh [tests] [micro] [sweep] [cells] [ckpt]
#   [moe] [permute]
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests micro cells ckpt}
tests() {
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/pcg_core/quant/kernels/test_quant_gpu.py tests/pcg_core/quant/kernels/test_quant_w4a8.py \
    tests/pcg_core/quant/layers/test_quant_fp4_experts.py -k "int4 or w4a16 or fp4 or w4a8" 2>&1 | tee "$OUT/quant4_tests.txt" | tail -15
}
w4a8() {
  timeout ${W4A8_TIMEOUT:-100} python3 benchmarks/w4a8_gemm.py --out "$OUT/w4a8_gemm.json" 2>&1 | tee "$OUT/w4a8_gemm.txt" | tail -8
  timeout ${W4A8_SWEEP_TIMEOUT:-200} python3 benchmarks/w4a8_gemm.py --sweep-large --out "$OUT/w4a8_sweep_large.json" 2>&1 \
    | tee "$OUT/w4a8_sweep_large.txt" | grep -v '^  ' | tail -8
  timeout ${W4A8_SCAN_TIMEOUT:-100} python3 benchmarks/w4a8_gemm.py --scan-threshold --out "$OUT/w4a8_scan.json" 2>&1 \
    | tee "$OUT/w4a8_scan.txt" | tail -9
}
micro() {
  timeout ${MICRO_TIMEOUT:-200} python3 benchmarks/w4a16_gemm.py --out "$OUT/w4a16_gemm.json" 2>&1 | tee "$OUT/w4a16_gemm.txt" | tail -12
  timeout ${SCAN_TIMEOUT:-120} python3 benchmarks/w4a16_gemm.py --scan-threshold --out "$OUT/w4a16_scan.json" 2>&1 | tee "$OUT/w4a16_scan.txt" | tail -12
}
sweep() {
  timeout ${SWEEP_TIMEOUT:-300} python3 benchmarks/w4a16_gemm.py --sweep --out "$OUT/w4a16_sweep.json" 2>&1 | tee "$OUT/w4a16_sweep.txt" | grep -v '^  ' | tail -20
}
cells() {
  CELLS=${CELLS:-"llama-3.1-8b:4 qwen3-8b:4"} QUANTS=${QUANTS:-"awq gptq fp4"} bash "$(dirname "$0")/gpu_quant.sh" cells
  for f in "$OUT"/quant_cells.*; do mv "$f" "${f/quant_cells/quant4_cells}"; done
}
moe() {
  timeout ${MOE_TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/pcg_core/quant/kernels/test_quant_gpu.py \
    -k "moe_gemm or grouped or rows_permuted" 2>&1 | tee "$OUT/moe_tests.txt" | tail -8
  timeout ${MOE_BENCH_TIMEOUT:-300} python3 benchmarks/moe_gemm.py --out "$OUT/moe_gemm.json" 2>&1 | tee "$OUT/moe_gemm.txt" | tail -16
}
permute() {
  timeout ${PERMUTE_TIMEOUT:-240} python3 benchmarks/w4a16_gemm.py --scan-permute --out "$OUT/w4a16_permute.json" 2>&1 \
    | tee "$OUT/w4a16_permute.txt" | tail -12
}
ckpt() {
  local dir=/tmp/pcg-ckpt; rm -rf "$dir"; mkdir -p "$dir"
  : > "$OUT/quant4_ckpt.jsonl"
  # format:scheme pairs × card:layers; written one after the other (CPU), the cells two at a time
  for pair in ${FORMATS:-awq:awq gptq:gptq gptq_v2:gptq compressed-tensors:gptq modelopt:fp4}; do
    for spec in ${CKPT_MODELS:-llama-3.1-8b:2 qwen3-8b:2}; do
      out="$dir/${spec%%:*}-${pair%%:*}"
      timeout ${WRITE_TIMEOUT:-300} python3 benchmarks/quant_checkpoint.py --model "${spec%%:*}" --layers "${spec##*:}" \
        --format "${pair%%:*}" --scheme "${pair##*:}" --out "$out" >> "$OUT/quant4_ckpt.err" 2>&1 || continue
      for graph in piecewise breakable; do echo "$out ${pair##*:} $graph"; done
    done
  done | xargs -P ${CELL_JOBS:-2} -L 1 bash -c '
    r=$(timeout ${CELL_TIMEOUT:-400} python3 -m harness.cli cell --model "$0" --weights real --quant "$1" --graph "$2" \
      --attention ${ATTENTION:-flex} --device cuda --max-tokens ${CELL_MAX_TOKENS:-512} --json 2>> "$OUT/quant4_ckpt.err")
    [[ -n $r ]] && echo "$r" >> "$OUT/quant4_ckpt.jsonl"; true'
  python3 benchmarks/cells_table.py "$OUT/quant4_ckpt.jsonl" | tee "$OUT/quant4_ckpt.md"
}
for phase in $phases; do $phase; done
