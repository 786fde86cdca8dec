#!/usr/bin/env bash
# The judge's H200 evidence (issue 16), in phases so each fits one device call:
#   tests        — pytest -m gpu tests/pcg_core (the runtime, after the engine's changes)
#   faults-a…d   — benchmarks/judge_faults.py faults on CUDA: every planted fault × the nightly's supported models
#                  at their nightly trims, bf16, piecewise (a: the two deep dense ones and the three MoE ones;
#                  b: Qwen3-8B and Llama-3.1-8B; c: the three MoE ones; d: Mixtral and Qwen3-235B)
#   quick        — the nightly's quick tier (every seed model × piecewise, 4096-token ladder), judged clean
# Usage (on the GPU machine, from the repo root): bash benchmarks/gpu_judge.sh tests faults-a
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests faults-a}
faults() {  # $1: name, $2: models
  timeout ${FAULTS_TIMEOUT:-560} python3 benchmarks/judge_faults.py faults --device cuda --bases piecewise --max-tokens 1024 \
    --max-new-tokens 8 --models "$2" --out "$OUT/faults_$1.jsonl" 2>"$OUT/faults_$1.err" | tee "$OUT/faults_$1.txt" | tail -14
}
for phase in $phases; do
  case $phase in
    tests) timeout 200 python3 -m pytest -q -m gpu tests/pcg_core 2>&1 | tee "$OUT/gpu_tests.txt" | tail -5 ;;
    faults-a) faults a "qwen3-0.6b:trim:28,qwen2.5-0.5b:trim:24,qwen3-30b-a3b:trim:4,mixtral-8x7b:trim:2,qwen3-235b-a22b:trim:2" ;;
    faults-b) faults b "qwen3-8b:trim:4,llama-3.1-8b:trim:4" ;;
    faults-d) faults d "mixtral-8x7b:trim:2,qwen3-235b-a22b:trim:2" ;;
    faults-c) faults c "qwen3-30b-a3b:trim:4,mixtral-8x7b:trim:2,qwen3-235b-a22b:trim:2" ;;
    quick)
      timeout 500 python3 -m harness.cli run harness/configs/nightly.yaml --tier quick --db "$OUT/quick.db" \
        --logs "$OUT/quick-logs" --no-report --allow-failures > "$OUT/quick.txt" 2>&1
      python3 -m harness.cli report latest --db "$OUT/quick.db" --out "$OUT/quick_report" | tail -30 | tee -a "$OUT/quick.txt" ;;
  esac
done
