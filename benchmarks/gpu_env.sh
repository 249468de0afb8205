# The environment of every GPU script here; source it from the repository root: `source benchmarks/gpu_env.sh`.
#
# DeepSpeed: the installed one when python3 imports it and DS_VERSION is unset; otherwise DeepSpeed DS_VERSION (default:
# the newest in the wheels directory) from wheels, installed once with pip --target under the work directory. Wheels
# directory: ZEROPP_WHEELS (default .whl), holding deps/*.whl (DeepSpeed's pure-Python dependencies) and
# ds-VERSION/*.whl. For a host without a package index, on one with (Python 3.12 there, for example):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl/deps hjson annotated-types typing-inspection pydantic pydantic-core
#   pip download --no-deps --no-binary :all: -d /tmp/src deepspeed==0.19.8   # DeepSpeed is published as source
#   tar xzf /tmp/src/deepspeed-0.19.8.tar.gz -C /tmp/src
#   (cd /tmp/src/deepspeed-0.19.8 && DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation -w "$OLDPWD/.whl/ds-0.19.8" .)
# Work directory: ZEROPP_WORK (default ${TMPDIR:-/tmp}/deepspeed_zeropp_gpu): installed wheels, torch extension
# builds (one folder per DeepSpeed release: builds of its op must not mix), and OUTDIR (default $OUT, else out/).
#
# Exports: PYTHONPATH (this checkout first), TORCH_EXTENSIONS_DIR, TORCH_CUDA_ARCH_LIST (the GPU's own compute
# capability unless set: DeepSpeed's import and op build fail on torch >= 2.11's default list), NVLink multicast off
# (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1: hosts that lend GPUs to isolated
# jobs may not allow it) and PYTHONUNBUFFERED=1.
ZEROPP_WORK=${ZEROPP_WORK:-${TMPDIR:-/tmp}/deepspeed_zeropp_gpu}
ZEROPP_WHEELS=${ZEROPP_WHEELS:-.whl}
OUTDIR=${OUT:-$ZEROPP_WORK/out}
mkdir -p "$ZEROPP_WORK" "$OUTDIR"

_zeropp_install() {  # TARGET WHEEL...: once per target; a .done marker, so an interrupted install is redone
    local target=$1
    shift
    [ -f "$target.done" ] && return 0
    [ -e "$1" ] || { echo "gpu_env.sh: no wheels for $target ($1 missing)" >&2; return 1; }
    rm -rf "$target"
    PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$target" "$@" &&
        touch "$target.done"
}

if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ] || [[ "$TORCH_CUDA_ARCH_LIST" == *[a-zA-Z]* ]]; then  # DeepSpeed reads "9.0a" as a number
    TORCH_CUDA_ARCH_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
_zeropp_path=$PWD
_zeropp_failed=
if [ -z "${DS_VERSION:-}" ] && python3 -c "import deepspeed" > /dev/null 2>&1; then
    DS_VERSION=$(python3 -c "from importlib.metadata import version; print(version('deepspeed'))")
    echo "gpu_env.sh: installed DeepSpeed $DS_VERSION"
else
    if [ -z "${DS_VERSION:-}" ]; then
        DS_VERSION=$(find "$ZEROPP_WHEELS" -maxdepth 1 -name 'ds-*' -printf '%f\n' 2>/dev/null | sed 's/^ds-//' |
            sort -V | tail -n 1)
    fi
    if [ -z "$DS_VERSION" ]; then
        echo "gpu_env.sh: DeepSpeed is not importable and $ZEROPP_WHEELS has no ds-VERSION/ wheels" >&2
        _zeropp_failed=1
    else
        { _zeropp_install "$ZEROPP_WORK/site" "$ZEROPP_WHEELS"/deps/*.whl &&
            _zeropp_install "$ZEROPP_WORK/ds-$DS_VERSION" "$ZEROPP_WHEELS/ds-$DS_VERSION"/*.whl &&
            echo "gpu_env.sh: DeepSpeed $DS_VERSION from $ZEROPP_WHEELS"; } || _zeropp_failed=1
        _zeropp_path=$_zeropp_path:$ZEROPP_WORK/ds-$DS_VERSION:$ZEROPP_WORK/site
    fi
fi
export PYTHONPATH=$_zeropp_path${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$ZEROPP_WORK/tx-$DS_VERSION}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OUTDIR DS_VERSION ZEROPP_WORK
unset _zeropp_path
[ -z "$_zeropp_failed" ]  # the status of `source`: non-zero when DeepSpeed could not be set up
