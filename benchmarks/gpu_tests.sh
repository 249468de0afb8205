#!/usr/bin/env bash
# The GPU test tier (tests/gpu) with the environment of benchmarks/gpu_env.sh: kernels against the reference and
# DeepSpeed's op, ZeRO-3 training with 2 ranks on one GPU (gloo) and on 2 GPUs (NCCL), qgZ with the ranks as 2 nodes
# (on one GPU and on 2).
# Logs and the JUnit XML go to $OUTDIR (gpu_env.sh: $OUT when set).
#   bash benchmarks/gpu_tests.sh [pytest arguments, default tests/gpu]
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$OUTDIR/gpus.csv"
python3 -m pytest "${@:-tests/gpu}" -q -rA -p no:cacheprovider --junitxml="$OUTDIR/junit-gpu.xml" -o addopts="" \
    2>&1 | tee "$OUTDIR/pytest-gpu.log"
