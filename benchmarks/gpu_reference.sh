#!/usr/bin/env bash
# Issue 47 on the device: the FP8 block layouts over K-block counts, the 8-bit and shape GPU tests, and cells under
# the judge's reference layer. Phases (default: layout tests before after seeds; `experts` on request)
#   layout — benchmarks/fp8_block_layout.py (old vs new weight-scale layout, K/128 = 1…20; W4AFP8's block GEMM)
#   experts — benchmarks/reference_experts.py (the experts' reference, every expert vs the routed ones: the twin's)
#   tests  — pytest -m gpu on the 8-bit kernel tests, the shape tests and an HF fp8 checkpoint at hidden 896
#   before — Qwen2.5-0.5B (24 layers) × fp8_block × piecewise with the old layout planted (PCG_PLUGINS)
#   after  — the same cell with the fix, under piecewise, breakable and full
#   seeds  — one unquantized nightly cell (piecewise, flex, 4096 tokens) per seed model (lists/reference-seeds.txt)
# Carry .whl (pydantic, SQLAlchemy: benchmarks/gpu_nightly.sh says how to fetch them).
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-layout tests before after seeds}
here=$(dirname "$0")
if [[ " $phases " == *" layout "* ]]; then
  timeout 120 python3 "$here/fp8_block_layout.py" 2>&1 | tee "$OUT/fp8_block_layout.txt" | tail -8
fi
if [[ " $phases " == *" experts "* ]]; then
  timeout 120 python3 "$here/reference_experts.py" --tokens 2 8 16 256 --json "$OUT/reference_experts.json" 2>&1 \
    | tee "$OUT/reference_experts.txt" | tail -6
fi
if [[ " $phases " == *" tests "* ]]; then
  timeout 240 python3 -m pytest -q -m gpu tests/pcg_core/quant/kernels/test_quant_gpu.py tests/pcg_core/quant/kernels/test_quant_shapes_gpu.py \
    tests/harness/cell/judge/test_reference_checkpoint.py \
    2>&1 | tee "$OUT/gpu_tests.txt" | tail -15
fi
if [[ " $phases " == *" before "* ]]; then
  PCG_PLUGINS=benchmarks.planted_fp8_block_layout timeout ${BEFORE_TIMEOUT:-300} python3 -m harness.cli cell \
    --model qwen2.5-0.5b --layers 24 --attention flex --graph piecewise --quant fp8_block --device cuda \
    --max-tokens 4096 --json > "$OUT/before.jsonl" 2> "$OUT/before.err"
  echo "before: rc $?"
fi
if [[ " $phases " == *" after "* ]]; then
  printf 'qwen2.5-0.5b:24 flex %s eager fp8_block 4096\n' piecewise breakable full > /tmp/after.txt
  NAME=after CELL_JOBS=3 LIST_TIMEOUT=${LIST_TIMEOUT:-260} bash "$here/gpu_cells.sh" /tmp/after.txt | tail -6
fi
if [[ " $phases " == *" seeds "* ]]; then
  NAME=seeds CELL_JOBS=${CELL_JOBS:-3} LIST_TIMEOUT=${LIST_TIMEOUT:-530} bash "$here/gpu_cells.sh" \
    "$here/lists/reference-seeds.txt" | tail -14
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    for line in f.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        ref = (d.get("metrics") or {}).get("reference") or {}
        spec = d.get("spec") or {}
        print(f"{f.stem:7} {spec.get('model', '?'):16} {spec.get('quant', '?'):10} {spec.get('graph', '?'):10} "
              f"{d.get('status'):14} reference {ref.get('status')}: mean {ref.get('mean_logprob_diff')} "
              f"(bound {ref.get('mean_bound')}), max {ref.get('max_logprob_diff')} (bound {ref.get('max_bound')}), "
              f"kernel {ref.get('kernel_rel')} (bound {ref.get('kernel_bound')})")
PY
