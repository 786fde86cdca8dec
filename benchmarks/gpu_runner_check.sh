#!/usr/bin/env bash
# The launcher on the GPU: its workers die with it, and a resume finishes the run. Two device calls, resumable:
#   1st: pytest -m gpu tests/pcg_core; the nightly's quick tier into a copy of the 2026-11-29 store, its runner
#        SIGKILLed while a worker holds the GPU (then: live workers? GPU processes?); a --resume within budget.
#   2nd (PHASE=finish): --resume until the run is done, then `pcgh report` and `pcgh diff 2 3`.
# Carry .whl (pydantic, SQLAlchemy wheels: benchmarks/gpu_nightly.sh says how). A short table is printed last.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off (gpu_env.sh)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PWD:/tmp/site || exit 1
OUT=${OUT:-out}; mkdir -p "$OUT" .gpucheck
DB=.gpucheck/nightly.db LOGS=/tmp/pcg-logs
RUN=(python3 -m harness.cli run harness/configs/nightly.yaml --tier quick --db "$DB" --logs "$LOGS" --trigger nightly)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
gpu_apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . ; }
workers() { pgrep -f harness.launcher.worker | grep -c . ; }

if [[ ${PHASE:-first} == first ]]; then
  timeout 200 python3 -m pytest -q -m gpu tests/pcg_core 2>&1 | tee "$OUT/gpu_tests.txt" | tail -3
  cp benchmarks/results/2026-11-29-h200/nightly/nightly.db "$DB"
  "${RUN[@]}" > "$OUT/killed_run.txt" 2>&1 &
  runner=$!
  for _ in $(seq 120); do [[ $(workers) -gt 0 ]] && break; sleep 1; done
  sleep 20  # the worker is loading its model onto the GPU or running it (nvidia-smi may not list it in a container)
  before_workers=$(workers) before_apps=$(gpu_apps)
  kill -9 "$runner"; wait "$runner" 2>/dev/null
  sleep 5
  after_workers=$(workers) after_apps=$(gpu_apps)
  echo "at the SIGKILL: $before_workers worker(s), $before_apps GPU process(es); 5 s later: $after_workers worker(s), $after_apps GPU process(es)" \
    | tee "$OUT/kill.txt"
  timeout 230 "${RUN[@]}" --resume --no-report > "$OUT/resume1.txt" 2>&1; echo "resume rc=$?" >> "$OUT/resume1.txt"
  tail -3 "$OUT/resume1.txt"
else
  timeout 420 "${RUN[@]}" --resume > "$OUT/resume2.txt" 2>&1; echo "resume rc=$?" >> "$OUT/resume2.txt"
  tail -12 "$OUT/resume2.txt"
  python3 -m harness.cli report latest --db "$DB" --out "$OUT/report" > /dev/null 2>&1
  python3 -m harness.cli diff 2 latest --db "$DB" > "$OUT/diff_2_3.md" 2>&1
  cp "$DB" "$OUT/nightly.db"
fi
echo
echo "| check | result |"
echo "|---|---|"
[[ -f $OUT/gpu_tests.txt ]] && echo "| pytest -m gpu tests/pcg_core | $(tail -1 "$OUT/gpu_tests.txt") |"
[[ -f $OUT/kill.txt ]] && echo "| runner SIGKILLed mid-cell | $(cat "$OUT/kill.txt") |"
for f in "$OUT"/resume*.txt; do [[ -f $f ]] && echo "| $(basename "$f" .txt) | $(grep -h '^run \|resume rc' "$f" | tr '\n' ' ') |"; done
