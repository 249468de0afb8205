#!/usr/bin/env bash
# The GPU test tier on a GPU host without a package index (run from the repository root, DeepSpeed wheels in .whl/
# as made by ../shared/tools/gpu-wheels.sh): kernels against the reference and DeepSpeed's op, ZeRO-3 training with
# 2 ranks on one GPU (gloo) and on 2 GPUs (NCCL), qgZ on 2 GPUs as 2 nodes. Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
W=/tmp/gt
OUTDIR=${OUT:-$W/out}
mkdir -p "$W" "$OUTDIR"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 TORCH_EXTENSIONS_DIR=$W/tx
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
[ -d $W/site ] || pipi $W/site .whl/deps/*.whl
[ -d $W/ds ] || pipi $W/ds .whl/ds-0.19.8/*.whl
export PYTHONPATH=$PWD:$W/ds:$W/site
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$OUTDIR/gpus.csv"
python3 -m pytest tests/gpu -q -rA -p no:cacheprovider --junitxml="$OUTDIR/junit-gpu.xml" -o addopts="" \
    2>&1 | tee "$OUTDIR/pytest-gpu.log"
