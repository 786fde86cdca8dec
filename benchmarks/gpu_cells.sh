#!/usr/bin/env bash
# Any list of `pcgh cell` runs on CUDA, ${CELL_JOBS:-8} at a time, one result file per cell (concurrent appends to
# one file have come back unreadable), gathered into $OUT/${NAME:-cells}.jsonl, .err and .md at the end.
# Each line of the list file: model:layers (or model:tiny) attention graph [compiler [quant [max_tokens [kv_cache]]]]
# The list stops after ${LIST_TIMEOUT:-540} s (cells not started are lost, running ones killed) so that the gathering
# below always runs: the device brings back only a few files, never the per-cell ones.
# Usage on the GPU machine, from the repo root: bash benchmarks/gpu_cells.sh LIST_FILE
source "$(dirname "$0")/gpu_env.sh"
name=${NAME:-cells}
mkdir -p "$OUT/$name"
grep -v '^\s*\(#\|$\)' "$1" | nl -w1 -s' ' | timeout ${LIST_TIMEOUT:-540} xargs -P ${CELL_JOBS:-8} -L 1 bash -c '
  i=$0 spec=$1 attention=$2 graph=$3 compiler=${4:-eager} quant=${5:-none} tokens=${6:-256} kv=${7:-auto}
  model=${spec%%:*}; layers=${spec##*:}
  if [[ $layers == tiny ]]; then size=(--tiny); else size=(--layers "$layers"); fi
  t0=$SECONDS
  timeout ${CELL_TIMEOUT:-500} python3 -m harness.cli cell --model "$model" "${size[@]}" --attention "$attention" \
    --graph "$graph" --compiler "$compiler" --quant "$quant" --kv-cache "$kv" --device ${DEVICE:-cuda} \
    --max-tokens "$tokens" --json \
    > "$OUT/'"$name"'/$i.json" 2> "$OUT/'"$name"'/$i.err"
  rc=$?; echo "cell $i ($spec $attention $graph $compiler $quant $kv): rc $rc, $((SECONDS - t0)) s"' 
# a list cut by LIST_TIMEOUT leaves its running cells behind (xargs dies, its children do not): they would hold
# the GPU's memory under the next list
pkill -TERM -f "harness.cli cell" && sleep 5; pkill -KILL -f "harness.cli cell"
cat "$OUT/$name"/*.json > "$OUT/$name.jsonl" 2>/dev/null
for f in "$OUT/$name"/*.err; do echo "== cell $(basename "$f" .err)"; tail -30 "$f"; done > "$OUT/$name.err"
rm -rf "$OUT/$name"  # the device returns a few files per call: the gathered ones only
python3 benchmarks/cells_table.py "$OUT/$name.jsonl" | tee "$OUT/$name.md"
# the compile caches, for the next call to carry as .whl/compile-cache.tgz; left out over the device's 16 MiB a file.
# Both packed came to 64-78 MiB on the big MoE cells (2026-12-04b): then Triton's alone (the kernels) is tried.
pack=$OUT/compile-cache.tgz
for part in . triton; do
  tar -czf "$pack" -C "$PCG_COMPILE_CACHE" "$part" 2>/dev/null || { rm -f "$pack"; continue; }
  size=$(stat -c %s "$pack")
  (( size <= 15 * 1024 * 1024 )) && { echo "compile cache ($part) $((size >> 20)) MiB: kept"; break; }
  echo "compile cache ($part) $((size >> 20)) MiB, over what comes back: not kept" \
    "($(du -sh "$PCG_COMPILE_CACHE"/* | tr '\n\t' '; '))"
  rm -f "$pack"
done
