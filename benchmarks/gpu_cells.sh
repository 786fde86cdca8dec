#!/usr/bin/env bash
# Any list of `pcgh cell` runs on CUDA, ${CELL_JOBS:-8} at a time and no more together than the GPU holds by the
# peaks earlier cells of their kinds recorded (benchmarks/cells_runner.py), one result file per cell (concurrent
# appends to one file have come back unreadable), gathered into $OUT/${NAME:-cells}.jsonl, .err and .md at the end.
# Each line of the list file: model:layers (or model:tiny) attention graph [compiler [quant [max_tokens [kv_cache]]]]
# The list stops after ${LIST_TIMEOUT:-540} s (cells not started are lost, running ones killed) so that the gathering
# below always runs: the device brings back only a few files, never the per-cell ones. A cell is not started when
# fewer than ${CELL_MIN_S:-0} s of the list's time are left (killed at the end, it would hold the device for nothing:
# set it to a cell's usual time, so the call ends early instead). Cells that ran out of GPU
# memory while others ran are tried again alone in the time left (RETRY_OOM=0: not); a retried cell's record
# replaces the first one.
# Usage on the GPU machine, from the repo root: bash benchmarks/gpu_cells.sh LIST_FILE
source "$(dirname "$0")/gpu_env.sh"
name=${NAME:-cells}
mkdir -p "$OUT/$name"
# One cell: list index, then the list line's fields. Exported for benchmarks/cells_runner.py, which runs them.
run_cell() {
  i=$1 spec=$2 attention=$3 graph=$4 compiler=${5:-eager} quant=${6:-none} tokens=${7:-256} kv=${8:-auto}
  model=${spec%%:*}; layers=${spec##*:}
  if (( $(date +%s) + ${CELL_MIN_S:-0} > DEADLINE )); then
    echo "cell $i ($spec $attention $graph $compiler $quant $kv): not started, under ${CELL_MIN_S:-0} s left"; return 0
  fi
  if [[ $layers == tiny ]]; then size=(--tiny); else size=(--layers "$layers"); fi
  t0=$SECONDS
  # --foreground: the cell alone gets the SIGTERM. Without it `timeout` sends a second one to the whole process group,
  # which lands while the cell's first (faulthandler's stack dump, pcgh cell) is still writing and kills it mid-dump
  # (2026-12-07h: every killed cell's stacks cut off). Its compile workers follow it out; -k: SIGKILL 30 s later.
  timeout --foreground -k 30 ${CELL_TIMEOUT:-500} python3 -m harness.cli cell --model "$model" "${size[@]}" --attention "$attention" \
    --graph "$graph" --compiler "$compiler" --quant "$quant" --kv-cache "$kv" --device ${DEVICE:-cuda} \
    --max-tokens "$tokens" --json > "$OUT/$name/$i.json${RETRY:+.again}" 2> "$OUT/$name/$i.err${RETRY:+.again}"
  rc=$?
  echo "cell $i ($spec $attention $graph $compiler $quant $kv): rc $rc, $((SECONDS - t0)) s${RETRY:+ (alone)}"
  # A retry's record replaces the first only where it wrote one and lost no verdict the first had (a whole verdict
  # whose reference layer alone ran out of memory stays against a retry killed or out of memory); its log follows.
  if [[ -n ${RETRY:-} ]]; then
    python3 benchmarks/cells_retry.py --keep "$OUT/$name/$i.json" "$OUT/$name/$i.json.again" \
      && mv "$OUT/$name/$i.json.again" "$OUT/$name/$i.json"
    { echo "== again, alone"; cat "$OUT/$name/$i.err.again"; } >> "$OUT/$name/$i.err"
    rm -f "$OUT/$name/$i.json.again" "$OUT/$name/$i.err.again"
  fi
}
export -f run_cell; export OUT name
# The cells run in a session of their own, killed together when the list's time is up: a list cut by LIST_TIMEOUT
# leaves its running cells behind (the runner dies, its children do not), and they would hold the GPU's memory under
# the next list; killing by name (`pkill -f "harness.cli cell"`) took down another list's cells run side by side.
run_list() {  # LIST_FILE JOBS SECONDS
  (( $3 > 0 )) || return 0
  export DEADLINE=$(( $(date +%s) + $3 ))
  setsid -w bash -c 'echo $$ > "$0"; exec timeout "$1" python3 benchmarks/cells_runner.py "$3" --jobs "$2" ${GPU_GIB:+--gpu-gib "$GPU_GIB"}' \
    "$OUT/$name.pgid" "$3" "$2" "$1"
  # by session: each cell's own `timeout` puts it in a process group of its own, never in a session of its own
  sid=$(cat "$OUT/$name.pgid"); pkill -TERM -s "$sid" && sleep 5; pkill -KILL -s "$sid"
  rm -f "$OUT/$name.pgid"
}
# The GPU's memory, for benchmarks/cells_runner.py: cells go side by side only as far as the peaks their kinds recorded
# in benchmarks/results/ fit in it (none recorded: CELL_JOBS alone limits them, as before)
GPU_GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{print $1 / 1024}')
export GPU_GIB
t_start=$SECONDS
grep -v '^\s*\(#\|$\)' "$1" | nl -w1 -s' ' > "$OUT/$name.todo"
run_list "$OUT/$name.todo" ${CELL_JOBS:-8} ${LIST_TIMEOUT:-540}
# Cells that ran out of memory beside others get the GPU to themselves in the time left (a cell's own OOM stays),
# and so do whole verdicts whose reference layer did:
# those whose status says so, and those that crashed with under RETRY_FREE_GIB (2) of device memory free (a library
# that fails to allocate may say only "internal error": cuDNN's, 2026-12-07f; harness/cell/crash.py notes the room).
python3 benchmarks/cells_retry.py "$OUT/$name" "${RETRY_FREE_GIB:-2}" | while read -r i; do grep "^$i " "$OUT/$name.todo"; done \
  > "$OUT/$name.oom"
if [[ -s $OUT/$name.oom && ${RETRY_OOM:-1} == 1 ]]; then
  echo "$(wc -l < "$OUT/$name.oom") cell(s) ran out of memory beside others: again, one at a time"
  RETRY=1 run_list "$OUT/$name.oom" 1 $(( ${LIST_TIMEOUT:-540} - (SECONDS - t_start) ))
fi
rm -f "$OUT/$name.todo" "$OUT/$name.oom"
cat "$OUT/$name"/*.json > "$OUT/$name.jsonl" 2>/dev/null
# each cell's phase marks (pcgh cell: when each phase began), then its last 80 other lines (a killed cell's stacks)
for f in "$OUT/$name"/*.err; do echo "== cell $(basename "$f" .err)"; grep "^PCG-PHASE" "$f"; grep -v "^PCG-PHASE" "$f" | tail -80; done > "$OUT/$name.err"
rm -rf "$OUT/$name"  # the device returns a few files per call: the gathered ones only
python3 benchmarks/cells_table.py "$OUT/$name.jsonl" | tee "$OUT/$name.md"
# the compile caches, for the next call to carry in .whl/ (one file, or parts, or none: see the script)
bash "$(dirname "$0")/pack_compile_cache.sh"
