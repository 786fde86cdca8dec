#!/usr/bin/env bash
# The nightly matrix on the device machine, resumable across calls (each call ≤ 10 minutes).
# Here, once:  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#   --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#   pydantic==2.13.4 pydantic_core==2.46.4 annotated_types==0.7.0 typing_inspection==0.4.2 sqlalchemy==2.1.9
# Device call (repeat until the run is finished; carry .whl and .nightly):
#   bash benchmarks/gpu_nightly.sh        → $OUT/nightly.db, $OUT/report/…; copy nightly.db back into .nightly/
#   FRESH=1 bash benchmarks/gpu_nightly.sh starts a new run in the same DB (for `pcgh diff` against the last one)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PWD:/tmp/site || exit 1
OUT=${OUT:-out}; mkdir -p "$OUT" .nightly
DB=.nightly/nightly.db
resume=--resume; [[ -n ${FRESH:-} ]] && resume=
timeout ${BUDGET_S:-500} python3 -m harness.cli run harness/configs/nightly.yaml --db "$DB" $resume --trigger nightly \
  --logs /tmp/pcg-logs --no-report 2>&1 | tail -5
python3 -m harness.cli report latest --db "$DB" --out "$OUT/report" | tail -40
cp "$DB" "$OUT/nightly.db"
