#!/usr/bin/env bash
# Issue 45 on a multi-GPU kind (2, 4 or 8 GPUs of one host): the collectives' cost, split ops against captured in one
# graph (benchmarks/collectives.py under torchrun, on 2, 4 … up to the host's GPUs), then the parallel cells of
# harness/configs/multi_gpu.yaml through `pcgh run` (its launcher hands each cell its GPUs and runs cells of different
# sizes side by side; cells needing more GPUs than the host has are refused with "needs N GPUs"), resumable across
# calls. NVLink multicast stays off (gpu_env.sh exports the switches; every rank inherits them).
# Device call (carry .whl and .parallel):  bash benchmarks/gpu_parallel.sh → $OUT/parallel.db, $OUT/report.tgz,
#   $OUT/collectives-<n>.json; copy parallel.db back into .parallel/ before the next call (FRESH=1: a new run).
source "$(dirname "$0")/gpu_env.sh"
gpus=$(nvidia-smi -L | wc -l)
mkdir -p .parallel
DB=.parallel/parallel.db
if [[ -z ${SKIP_COLLECTIVES:-} ]]; then
  for n in 2 4 8; do
    (( n <= gpus )) || continue
    timeout ${COLLECTIVES_S:-150} torchrun --nproc_per_node "$n" benchmarks/collectives.py \
      --model harness/models/configs/Qwen__Qwen3-8B.json --layers 8 --json "$OUT/collectives-$n.json" 2>&1 | tail -8
  done
fi
resume=--resume; [[ -n ${FRESH:-} ]] && resume=
timeout ${BUDGET_S:-420} python3 -m harness.cli run harness/configs/multi_gpu.yaml --db "$DB" $resume \
  --logs /tmp/pcg-logs --trigger device --allow-failures ${ARGS:-} 2>&1 | tail -60
echo "pcgh run: exit ${PIPESTATUS[0]} (124: cut by BUDGET_S, resume with another call)"
cp "$DB" "$OUT/parallel.db"
python3 -m harness.cli report latest --db "$DB" --out "$OUT/report" >/dev/null 2>&1 \
  && tar czf "$OUT/report.tgz" -C "$OUT" report && rm -rf "$OUT/report"
