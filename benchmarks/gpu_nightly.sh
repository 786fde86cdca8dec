#!/usr/bin/env bash
# The nightly matrix on the device machine, resumable across calls (each call ≤ 10 minutes).
# Here, once:  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#   --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#   pydantic==2.13.4 pydantic_core==2.46.4 annotated_types==0.7.0 typing_inspection==0.4.2 sqlalchemy==2.1.9
# Once, here: seed the store with the previous committed nightly, so tonight's verdict and diff are against it:
#   mkdir -p .nightly && cp benchmarks/results/<previous>/nightly.db .nightly/nightly.db
# Device call (repeat until the run is finished; carry .whl and .nightly; ARGS narrows it, e.g. ARGS="--tier quick"):
#   bash benchmarks/gpu_nightly.sh  → $OUT/nightly.db, and once the run finishes $OUT/report.tgz (report/nightly.md: the
#   policy's verdict, diff.md: against the last nightly, the usual report); copy nightly.db back into .nightly/
#   FRESH=1 bash benchmarks/gpu_nightly.sh starts tonight's run (later calls resume it)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off (gpu_env.sh)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PWD:/tmp/site || exit 1
OUT=${OUT:-out}; mkdir -p "$OUT" .nightly
DB=.nightly/nightly.db
resume=--resume; [[ -n ${FRESH:-} ]] && resume=
# `pcgh nightly` exits 1 when the policy fails the night: the report is written all the same
timeout ${BUDGET_S:-500} python3 -m harness.cli nightly harness/configs/nightly.yaml --db "$DB" $resume ${ARGS:-} \
  --logs /tmp/pcg-logs --out "$OUT/report" 2>&1 | tail -60
echo "pcgh nightly: exit ${PIPESTATUS[0]} (124: cut by BUDGET_S, resume with another call)"
cp "$DB" "$OUT/nightly.db"
# the device brings back a few files per call: the report folder as one archive
[[ -d $OUT/report ]] && tar czf "$OUT/report.tgz" -C "$OUT" report && rm -rf "$OUT/report"
