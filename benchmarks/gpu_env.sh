# Sourced by the device scripts (gpu_run.sh, gpu_judge.sh, gpu_cells.sh): the carried wheels (.whl: pydantic,
# SQLAlchemy, which the GPU image lacks) installed beside the checkout, $OUT made, the compile caches set up, and the
# machine's facts written to $OUT/env.txt.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
# NVLink multicast off in NCCL, PyTorch and NVSHMEM, always (the device machines' rule: a program using it can put a
# host's shared GPUs out of service); exported here, so every cell, rank and torchrun below inherits it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if compgen -G ".whl/*.whl" >/dev/null; then
  # once per machine: device scripts started side by side must not reinstall under each other's imports
  [[ -f /tmp/site/.installed ]] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; }
  export PYTHONPATH=$PWD:/tmp/site
fi
OUT=${OUT:-out}; mkdir -p "$OUT"
# Triton's and Inductor's caches in one folder, seeded from a carried .whl/compile-cache.* (an earlier call's
# gpu_cells.sh pack, same image; .tar.xz, or the older .tgz): a fresh machine otherwise spends its first cells' 40-70 s
# compiling the same kernels again (a DeepSeek-V3 flex breakable cell's run phase took 354 s cold on the H100,
# 2026-12-07f; on the CPU the tiny one's cell takes 64 s cold, 9 warm). Both caches key entries by source, compiler
# and device, so a stale entry is a miss, never a wrong kernel.
export PCG_COMPILE_CACHE=${PCG_COMPILE_CACHE:-/tmp/pcg-compile-cache}
export TRITON_CACHE_DIR=$PCG_COMPILE_CACHE/triton TORCHINDUCTOR_CACHE_DIR=$PCG_COMPILE_CACHE/inductor
mkdir -p "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR"
# NO_CACHE_SEED=1: start cold (gpu_speed.sh: issue 38 times the whole ladder built cold)
if [[ -z ${NO_CACHE_SEED:-} ]]; then
  for f in .whl/compile-cache.tar.xz .whl/compile-cache.tgz; do
    [[ -f $f ]] && { tar -xf "$f" -C "$PCG_COMPILE_CACHE" || true; }
    parts=("$f".part*)  # pack_compile_cache.sh's parts of a pack over one file's limit, in order
    unzip=(xz -dc); [[ $f == *.tgz ]] && unzip=(gzip -dc)
    [[ -f ${parts[0]} ]] && { cat "${parts[@]}" | "${unzip[@]}" | tar -xf - -C "$PCG_COMPILE_CACHE" || true; }
  done
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
