"""Both `pip install .` and `pip install -e .` put deepspeed_zeropp.pth into site-packages, and with it
DEEPSPEED_ZEROPP=1 patches DeepSpeed in a script that never imports this package."""
import shutil
import site
import os
import subprocess
import venv
from pathlib import Path

from deepspeed_zeropp._version import __version__

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in", "deepspeed_zeropp.pth", "requirements",
           "csrc", "deepspeed_zeropp")


def test_regular_and_editable_installs_ship_the_pth(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in SHIPPED:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name,
             **({
                 "ignore": shutil.ignore_patterns("__pycache__")
             } if copy is shutil.copytree else {}))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site_packages = Path(
        subprocess.check_output([python, "-c", "import site; print(site.getsitepackages()[0])"], text=True).strip())
    # torch and DeepSpeed from this interpreter (a plain path entry: its own .pth files are not run)
    (site_packages / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    for editable in ([], ["-e"]):
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", *editable, str(source)], check=True)
        assert (site_packages / "deepspeed_zeropp.pth").is_file(), (editable,
                                                                    sorted(p.name for p in site_packages.iterdir()))
        if not editable:  # the demo's worker ships with the package; the test harness and the benchmarks do not
            assert (site_packages / "deepspeed_zeropp" / "demo" / "worker.py").is_file()
            assert not (site_packages / "harness").exists() and not (site_packages / "benchmarks").exists()
            assert not (site_packages / "deepspeed_zeropp" / "_harness").exists()
            version = "import importlib.metadata as m; print(m.version('deepspeed_zeropp'))"
            assert subprocess.check_output([python, "-c", version], text=True, cwd=tmp_path).strip() == __version__
    probe = (
        "import deepspeed, deepspeed_zeropp; from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer; "
        "print(deepspeed_zeropp.__file__, hasattr(CUDAQuantizer.quantize, '__deepspeed_zeropp__'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPSPEED_ZEROPP", "PYTHONPATH"))}
    env.update(DEEPSPEED_ZEROPP="1", DS_ACCELERATOR="cpu")
    proc = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.stdout.split() == [str(source / "deepspeed_zeropp" / "__init__.py"), "True"], proc.stdout + proc.stderr
    assert "[deepspeed_zeropp] active via DEEPSPEED_ZEROPP=1" in proc.stderr
