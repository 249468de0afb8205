# Sourced by the GPU scripts (from the repository root, on a GPU host without a package index): installs the
# DeepSpeed wheels (0.19.8, or DS_VERSION) from .whl/ (made by ../shared/tools/gpu-wheels.sh) once under /tmp/gt and exports the
# environment every GPU run here needs. TORCH_CUDA_ARCH_LIST=9.0: DeepSpeed's import and quantizer build fail on
# torch >= 2.11's default arch list; NVLink multicast off (see the device notes).
W=/tmp/gt
OUTDIR=${OUT:-$W/out}
mkdir -p "$W" "$OUTDIR"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 TORCH_EXTENSIONS_DIR=$W/tx
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
[ -d $W/site ] || pipi $W/site .whl/deps/*.whl
DS_VERSION=${DS_VERSION:-0.19.8}  # another release: its wheels in .whl/ds-VERSION/
[ -d $W/ds-$DS_VERSION ] || pipi $W/ds-$DS_VERSION .whl/ds-$DS_VERSION/*.whl
export PYTHONPATH=$PWD:$W/ds-$DS_VERSION:$W/site
