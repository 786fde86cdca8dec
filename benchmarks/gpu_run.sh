#!/usr/bin/env bash
# One device call: environment, GPU tests, then the prefill benchmark on the two model shapes.
# Usage (on the GPU machine, from the repo root): bash benchmarks/gpu_run.sh [quick]
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
if [ "${1:-}" != "bench" ]; then
  timeout 240 python3 -m pytest -q -x -m gpu tests 2>&1 | tee "$OUT/gpu_tests.txt" | tail -30
fi
if [ "${1:-}" != "tests" ]; then
  timeout 280 python3 benchmarks/prefill.py --model harness/models/configs/Qwen__Qwen3-0.6B.json --dtype bfloat16 \
    --json "$OUT/prefill_qwen3_0.6b.json" 2>&1 | tee "$OUT/prefill_qwen3_0.6b.txt"
  timeout 280 python3 benchmarks/prefill.py --model harness/models/configs/Qwen__Qwen3-30B-A3B.json --layers ${MOE_LAYERS:-8} \
    --dtype bfloat16 --json "$OUT/prefill_qwen3_30b_a3b.json" 2>&1 | tee "$OUT/prefill_qwen3_30b_a3b.txt"
fi
