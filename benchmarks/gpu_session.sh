#!/usr/bin/env bash
# One GPU session (issues 3 and 6) on a 2-GPU H200 host with no package index, run from the repository root:
#   BUDGET=540 bash benchmarks/gpu_session.sh TAG STEPS
# STEPS: comma list of pytest | ab (needs a reference copy of csrc/ in benchmarks/_ab_old/) | bench | e2e=STAGES (gpu_session.py's --stages, '+' = side by side, e.g.
# e2e=B+C1,C2,C3 -- the last item of the list, since it contains commas). Setup (DeepSpeed wheels from .whl/, versions)
# always runs and is idempotent. Everything lands in /tmp/gs/out_TAG and, packed, in $OUT/TAG.tgz plus $OUT/TAG.log.
# benchmarks/report_gpu.py turns the unpacked folder into benchmarks/results/.
#
# DeepSpeed releases live side by side as pip --target folders /tmp/gs/ds-VERSION (dependencies in /tmp/gs/site);
# a process picks one with PYTHONPATH=/tmp/gs/ds-VERSION:/tmp/gs/site:REPO and its own TORCH_EXTENSIONS_DIR
# (/tmp/gs/tx-VERSION). TORCH_CUDA_ARCH_LIST=9.0 is set for the whole session: DeepSpeed's import and its quantizer
# JIT build fail on torch >= 2.11's default arch list otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
TAG=${1:?tag}
STEPS=${2:-pytest,ab,bench,e2e=B+C1,C2,C3}
T0=$(date +%s)
BUDGET=${BUDGET:-540}
DEADLINE=$((T0 + BUDGET))
W=/tmp/gs
R=$W/out_$TAG
mkdir -p "$R"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PIP_DISABLE_PIP_VERSION_CHECK=1
P8="$W/ds-0.19.8:$W/site:$REPO"
P5="$W/ds-0.19.5:$W/site:$REPO"
left() { echo $((DEADLINE - $(date +%s))); }
stamp() { echo "== $(date +%T) (+$(($(date +%s) - T0)) s) $*"; }

pack() {
    stamp "packing"
    if [ -n "${OUT:-}" ]; then
        tar czf "$OUT/$TAG.tgz" -C "$R" . && cp "$R/session.log" "$OUT/$TAG.log"
    fi
}
trap pack EXIT
exec > >(tee -a "$R/session.log") 2>&1

stamp "setup"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
[ -d $W/site ] || pipi $W/site .whl/deps/*.whl
for v in 0.19.5 0.19.8; do [ -d $W/ds-$v ] || pipi $W/ds-$v .whl/ds-$v/*.whl; done
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$R/nvidia_smi.csv"
nvidia-smi topo -m > "$R/nvidia_topo.txt" 2>&1
git -C "$REPO" rev-parse HEAD > "$R/git_head.txt" 2>&1 || true
python3 - > "$R/env.json" <<'EOF'
import json, os, platform, subprocess, sys
import torch
env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
       "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
       "nccl": ".".join(map(str, torch.cuda.nccl.version())), "cudnn": torch.backends.cudnn.version()}
out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.split()
env["driver"] = out[0] if out else "unknown"
try:
    import transformers
    env["transformers"] = transformers.__version__
except Exception as exc:
    env["transformers"] = f"unavailable: {exc}"
for v in ("0.19.5", "0.19.8"):
    code = "import deepspeed; print(deepspeed.__version__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f"/tmp/gs/ds-{v}:/tmp/gs/site"))
    env[f"deepspeed_{v}"] = r.stdout.strip() or r.stderr.strip()[-300:]
print(json.dumps(env, indent=1))
EOF
cat "$R/env.json"

BG=""
if [ ! -f $W/tx-0.19.5.done ]; then  # DeepSpeed 0.19.5's own op, needed by its unpatched run (C1): build off the clock
    (PYTHONPATH=$P5 TORCH_EXTENSIONS_DIR=$W/tx-0.19.5 MAX_JOBS=8 timeout 300 python3 -c "
import time; t = time.time()
from deepspeed.ops.op_builder import QuantizerBuilder
QuantizerBuilder().load(); print('DeepSpeed 0.19.5 quantizer op built in %.1f s' % (time.time() - t))" \
        > "$R/ds0195_build.log" 2>&1 && touch $W/tx-0.19.5.done) &
    BG=$!
fi

stamp "build check of csrc/"
if ! PYTHONPATH=$P8 timeout 120 python3 -c "
import time, torch; torch.cuda.init(); t = time.time()
from deepspeed_zeropp.backends import cuda
error = cuda.load_error(); print('ours: build/load %.1f s, error: %s' % (time.time() - t, error)); raise SystemExit(error is not None)"
then
    echo "csrc/ does not build" | tee "$R/ab_decision.txt"
    if [ -f benchmarks/_ab_old/quantize.cu ]; then  # an A/B candidate that fails: fall back to the reference copy
        echo "reverting csrc/quantize.cu to benchmarks/_ab_old/" | tee -a "$R/ab_decision.txt"
        cp benchmarks/_ab_old/quantize.cu csrc/quantize.cu
    fi
fi

IFS=',' read -r -a items <<< "${STEPS%%e2e=*}"
E2E=""
[[ "$STEPS" == *e2e=* ]] && E2E=${STEPS#*e2e=}
for item in "${items[@]}"; do
    case "$item" in
    pytest)
        stamp "A: pytest tests/gpu with DeepSpeed 0.19.8 ($(left) s left)"
        PYTHONPATH=$P8 TORCH_EXTENSIONS_DIR=$W/tx-0.19.8 timeout 300 python3 -m pytest tests/gpu -q -rP \
            -p no:cacheprovider 2>&1 | tee "$R/pytest.log"
        ;;
    ab)
        stamp "A/B of csrc/ against benchmarks/_ab_old ($(left) s left)"
        PYTHONPATH=$P8 timeout 120 python3 benchmarks/ab_quantize.py --old benchmarks/_ab_old --json "$R/ab.json"
        python3 - "$R/ab.json" <<'EOF' | tee "$R/ab_decision.txt"
import json, sys
try:
    rows = {(r["dtype"], r["size"]): r for r in json.load(open(sys.argv[1]))["ab"]}
    new, old = rows[("bf16", "134M")]["new_gbps"], rows[("bf16", "134M")]["old_gbps"]
    same = all(r["identical"] for r in rows.values())
    keep = same and new >= old * 0.995
    print(f"bf16 134M quantize: new {new:.0f} GB/s, old {old:.0f} GB/s, outputs identical: {same} -> "
          f"{'keep' if keep else 'REVERT'}")
except Exception as exc:
    keep = True
    print(f"no A/B decision ({type(exc).__name__}: {exc}) -> keep")
open("/tmp/gs/revert", "w").write("" if keep else "1")
EOF
        if [ -s $W/revert ]; then cp benchmarks/_ab_old/quantize.cu csrc/quantize.cu; fi
        ;;
    bench)
        if [ -n "$BG" ]; then stamp "waiting for the DeepSpeed 0.19.5 op build"; wait $BG; BG=""; cat "$R/ds0195_build.log" | tail -3; fi
        stamp "A: kernel benchmark ($(left) s left)"
        PYTHONPATH=$P8 TORCH_EXTENSIONS_DIR=$W/tx-0.19.8 timeout 240 python3 benchmarks/bench_kernels.py \
            --out "$R/kernels"
        ;;
    esac
done
if [ -n "$BG" ]; then stamp "waiting for the DeepSpeed 0.19.5 op build"; wait $BG; tail -3 "$R/ds0195_build.log"; fi
if [ -n "$E2E" ]; then
    stamp "e2e stages $E2E ($(left) s left)"
    PYTHONPATH=$P8 TORCH_EXTENSIONS_DIR=$W/tx-0.19.8 timeout $(( $(left) > 10 ? $(left) : 10 )) \
        python3 benchmarks/gpu_session.py --stages "$E2E" --out "$R/e2e" --ds-root $W --deadline $DEADLINE
fi
cp csrc/quantize.cu "$R/quantize.cu.used"
stamp "done"
