#!/usr/bin/env bash
# The compile caches ($PCG_COMPILE_CACHE: Triton's and Inductor's) packed into $OUT for the next device call to carry
# in .whl/ (gpu_env.sh unpacks them): compile-cache.tar.xz, or, past one file's limit, compile-cache.tar.xz.part00 …
# (cat them back in order). The device returns files of at most 16 MiB and eight a call: parts of ${CACHE_PART_MIB:-15}
# MiB, at most ${CACHE_PARTS:-3} (gpu_cells.sh returns four other files). Over that, Triton's cache alone is tried,
# then nothing is kept.
# Both caches packed with gzip came to 35-78 MiB (2026-12-04b, 2026-12-07f): never back. Triton keeps every IR of a
# kernel beside its binary, and a cache hit reads only the binary, its metadata and the launcher (TRITON_STORE_BINARY_ONLY's
# rule; the PTX is kept too): 89 MiB of Triton's cache were 15 MiB of cubins and 38 of LLVM IR (2026-12-07e), and
# xz took what was left from 11 MiB (gzip, every IR) to 2.3.
# Usage: OUT=… PCG_COMPILE_CACHE=… bash benchmarks/pack_compile_cache.sh
part_bytes=$(( ${CACHE_PART_MIB:-15} * 1024 * 1024 )); parts_max=${CACHE_PARTS:-3}
pack=$OUT/compile-cache.tar.xz zip=(xz -T0 -6)
command -v xz >/dev/null || { pack=$OUT/compile-cache.tgz zip=(gzip); }  # gpu_env.sh reads either
for part in . triton; do
  rm -f "$pack" "$pack".part*
  tar -cf - --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.source' -C "$PCG_COMPILE_CACHE" \
    "$part" 2>/dev/null | "${zip[@]}" > "$pack" || { rm -f "$pack"; continue; }
  size=$(stat -c %s "$pack")
  if (( size <= part_bytes )); then
    echo "compile cache ($part) $((size >> 20)) MiB: kept"; exit 0
  fi
  if (( size <= parts_max * part_bytes )); then
    split -b "$part_bytes" -d -a 2 "$pack" "$pack.part" && rm -f "$pack"
    echo "compile cache ($part) $((size >> 20)) MiB: kept in $(( (size + part_bytes - 1) / part_bytes )) parts"; exit 0
  fi
  echo "compile cache ($part) $((size >> 20)) MiB, over what comes back: not kept" \
    "($(du -sh "$PCG_COMPILE_CACHE"/* | tr '\n\t' '; '))"
  rm -f "$pack"
done
exit 0
