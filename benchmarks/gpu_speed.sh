#!/usr/bin/env bash
# Issue 38 on the device: the prep graphs' GPU tests, then issue 38's table re-measured side by side in one run per
# shape (benchmarks/prefill.py prints each target with ✓/✗ last). Phases (default: tests dense); each fits one
# device call of 600 s:
#   tests — pytest -m gpu tests/pcg_core/engine/test_prep_graphs.py tests/pcg_core/test_gpu.py
#           tests/pcg_core/attention/test_fresh_paths.py (prep replay = eager metadata bit for bit, planted not-replayed graph
#           caught; every capture backend's replay = eager; MLA's expanded prefill and varlen's fresh read, both
#           graph variants = eager)
#   dense — Qwen3-0.6B shape, 28 layers, bf16, the default ladder to 4096: flex, sdpa, varlen × full, breakable,
#           piecewise, + inductor pieces, + torch.compile reduce-overhead
#   moe   — Qwen3-30B-A3B shape, 8 layers: flex and sdpa × full and breakable
#   mla   — benchmarks/mla_prefill.py (absorbed, expanded and pcg's fresh path; ≤ 1.2× expanded at 2048 ✓/✗)
#   pools — the graph pools of gpt-oss-120b and Grok-2 at the nightly trims on sdpa (its plain-math path, now in row
#           chunks) and flex, one cell at a time (issue 38: ≤ 4 GiB); lists/speed-pools.txt
#   flexcall — benchmarks/flex_call.py: a direct flex call's host µs and GPU ms, part by part (dynamo frame and
#           guards, the config patch, inductor's artifact alone, the eager ops around), and its profile
#   flexrows — flex under 128 rows: inductor's decoding kernel (flex as it is) against its main kernel (flex_main),
#           Qwen3-0.6B shape, 8–128 tokens (+512) full, breakable and full:inductor; then flex_call.py's decode
#           (8 and 32 × 512 context) and small prefill cases under both kernels (the decoding kernel is made for decode)
#   varlen — varlen against sdpa to 2048 tokens with the fresh path's bounded sequences (2026-12-08: 1.65× sdpa at
#           2048 before), the forward at 2048 profiled
# Carry .whl (pydantic, SQLAlchemy).
# cold compile caches of its own: the build times are issue 38's "built cold" (a cells call before it on the same
# machine, or a carried .whl/compile-cache, would make them warm)
export PCG_COMPILE_CACHE=${SPEED_COMPILE_CACHE:-/tmp/pcg-speed-cache-$$} NO_CACHE_SEED=1
source "$(dirname "$0")/gpu_env.sh"
phases=${*:-tests flexcall dense}
here=$(dirname "$0")
cfg=harness/models/configs
tok=8,32,128,512,2048
if [[ " $phases " == *" tests "* ]]; then
  timeout 300 python3 -m pytest -q -m gpu tests/pcg_core/engine/test_prep_graphs.py tests/pcg_core/test_gpu.py \
    tests/pcg_core/attention/test_fresh_paths.py 2>&1 \
    | tee "$OUT/speed_tests.txt" | tail -6
fi
if [[ " $phases " == *" dense "* ]]; then
  timeout 560 python3 "$here/prefill.py" --model $cfg/Qwen__Qwen3-0.6B.json --tokens $tok \
    --configs flex/full,flex/breakable,flex/piecewise,sdpa/full,sdpa/breakable,varlen/full,varlen/breakable,flex/piecewise:inductor,flex/full:inductor \
    --reduce-overhead --json "$OUT/prefill_dense.json" 2>&1 | grep -v Warning | tee "$OUT/prefill_dense.txt" | tail -40
fi
if [[ " $phases " == *" moe "* ]]; then
  timeout 560 python3 "$here/prefill.py" --model $cfg/Qwen__Qwen3-30B-A3B.json --layers 8 --tokens $tok \
    --configs flex/full,flex/breakable,sdpa/full,sdpa/breakable --json "$OUT/prefill_moe.json" 2>&1 \
    | grep -v Warning | tee "$OUT/prefill_moe.txt" | tail -25
fi
if [[ " $phases " == *" flexcall "* ]]; then
  timeout 300 python3 "$here/flex_call.py" --json "$OUT/flex_call.json" 2>&1 | tee "$OUT/flex_call.txt" | tail -20
fi
if [[ " $phases " == *" flexrows "* ]]; then
  timeout 420 python3 "$here/prefill.py" --model $cfg/Qwen__Qwen3-0.6B.json --tokens 8,16,32,64,128,512 --profile-at 8,32 \
    --configs flex/full,flex_main/full,flex/breakable,flex_main/breakable,flex/full:inductor,flex_main/full:inductor \
    --json "$OUT/prefill_flexrows.json" 2>&1 | grep -v Warning | tee "$OUT/prefill_flexrows.txt" | tail -30
  timeout 150 python3 "$here/flex_call.py" --cases decode_8x512,decode_32x512,prefill_1x8,prefill_1x32 \
    --json "$OUT/flex_rows_call.json" 2>&1 | tee "$OUT/flex_rows_call.txt" | tail -26
fi
if [[ " $phases " == *" varlen "* ]]; then
  timeout 300 python3 "$here/prefill.py" --model $cfg/Qwen__Qwen3-0.6B.json --tokens 8,128,512,2048 --profile-at 2048 \
    --configs sdpa/full,varlen/full,varlen/breakable --json "$OUT/prefill_varlen.json" 2>&1 | grep -v Warning \
    | tee "$OUT/prefill_varlen.txt" | tail -25
fi
if [[ " $phases " == *" mla "* ]]; then
  timeout 300 python3 "$here/mla_prefill.py" --profile 2048 --json "$OUT/mla_prefill.json" 2>&1 | tee "$OUT/mla_prefill.txt" | tail -45
fi
if [[ " $phases " == *" pools "* ]]; then
  NAME=pools CELL_JOBS=1 LIST_TIMEOUT=${POOLS_TIMEOUT:-540} bash "$here/gpu_cells.sh" "$here/lists/speed-pools.txt" | tail -12
fi
