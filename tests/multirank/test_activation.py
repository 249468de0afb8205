"""DEEPSPEED_ZEROPP=1: unmodified scripts (HF Trainer under torchrun, a plain loop under the deepspeed launcher)
get the patch, 2 CPU ranks; lean and off unless set. Needs the package installed (``pip install .`` or ``-e``), which puts
deepspeed_zeropp.pth into site-packages."""
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from harness.launch import extensions_dir, free_port, release_shared_memory

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def hook_installed():
    return any((Path(d) / "deepspeed_zeropp.pth").exists() for d in site.getsitepackages())


@pytest.fixture(autouse=True)
def require_installed_hook():
    assert hook_installed(), "deepspeed_zeropp.pth is not in site-packages: pip install . (or -e .)"


def run(args, activate, timeout=600, port=None):
    env = dict(os.environ,
               DS_ACCELERATOR="cpu",
               LOCAL_SIZE="2",
               OMP_NUM_THREADS="1",
               TORCH_EXTENSIONS_DIR=extensions_dir(),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("DEEPSPEED_ZEROPP", None)
    if activate:
        env["DEEPSPEED_ZEROPP"] = "1"
    try:
        return subprocess.run(args, env=env, cwd="/tmp", capture_output=True, text=True, timeout=timeout)
    finally:
        if port:
            release_shared_memory(port)


def result_of(proc):
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_lean_and_off_unless_set():
    probe = ("import sys; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'deepspeed', "
             "'deepspeed_zeropp'}), [type(f).__name__ for f in sys.meta_path])")
    on = run([sys.executable, "-c", probe], activate=True)
    off = run([sys.executable, "-c", probe], activate=False)
    assert on.stdout.startswith("['deepspeed_zeropp'] [") and "'_PatchAfterDeepSpeedImport'" in on.stdout, on.stdout
    assert off.stdout.startswith("[] ") and "_PatchAfterDeepSpeedImport" not in off.stdout, off.stdout


def test_hf_trainer_under_torchrun():
    port = free_port()
    script = [
        str(BIN / "torchrun"), "--nproc_per_node", "2", f"--master_port={port}",
        str(ROOT / "examples" / "hf_trainer_bert.py"), "--deepspeed",
        str(ROOT / "examples" / "ds_config_zeropp.json")
    ]
    result = result_of(run(script, activate=True, port=port))
    assert result["zeropp_active"] and result["dtypes_seen"] == ["torch.bfloat16"]
    assert len(result["losses"]) == 3 and all(0 < loss < 5 for loss in result["losses"])
    unpatched = run(script, activate=False, port=port)
    assert unpatched.returncode != 0 and "RESULT" not in unpatched.stdout


def test_plain_script_under_deepspeed_launcher():
    port = free_port()
    script = [
        str(BIN / "deepspeed"), "--num_gpus", "2", f"--master_port={port}",
        str(ROOT / "examples" / "plain_deepspeed.py"), "--deepspeed_config",
        str(ROOT / "examples" / "ds_config_zeropp.json")
    ]
    proc = run(script, activate=True, port=port)
    result = result_of(proc)
    assert result["zeropp_active"] and result["dtypes"] == ["torch.bfloat16"] and len(result["losses"]) == 3
    assert "[deepspeed_zeropp] active via DEEPSPEED_ZEROPP=1" in proc.stdout + proc.stderr
