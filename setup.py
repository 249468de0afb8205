"""Packaging for deepspeed_zeropp: the package, its CUDA sources, and the .pth file for DEEPSPEED_ZEROPP=1."""
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "deepspeed_zeropp.pth"


def requirements(name):
    with open(os.path.join(HERE, "requirements", name)) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


class BuildPyWithExtras(build_py):
    """Ship csrc/ inside the package (deepspeed_zeropp/_csrc) and the .pth file at the site-packages root."""

    def run(self):
        super().run()
        shutil.copy(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH))
        csrc = os.path.join(HERE, "csrc")
        if os.path.isdir(csrc):
            shutil.copytree(csrc, os.path.join(self.build_lib, "deepspeed_zeropp", "_csrc"), dirs_exist_ok=True)


class DevelopWithPth(develop):
    """Legacy editable installs: put the .pth file beside the egg-link."""

    def run(self):
        super().run()
        shutil.copy(os.path.join(HERE, PTH), os.path.join(self.install_dir, PTH))


COMMANDS = {"build_py": BuildPyWithExtras, "develop": DevelopWithPth}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: pip falls back to `setup.py develop`
    pass
else:

    class EditableWheelWithPth(editable_wheel):
        """PEP 660 editable installs (``pip install -e .``): setuptools writes everything in the unpacked wheel's
        root to site-packages; its namespace step (the hook here) is the one that fills that root, so the .pth
        file is put there too."""

        def _install_namespaces(self, installation_dir, *args, **kwargs):
            shutil.copy(os.path.join(HERE, PTH), os.path.join(installation_dir, PTH))
            return super()._install_namespaces(installation_dir, *args, **kwargs)

    COMMANDS["editable_wheel"] = EditableWheelWithPth

setup(
    name="deepspeed_zeropp",
    version="0.1.0",
    description="ZeRO-3 quantized weights (ZeRO++) that keep every parameter's dtype, on every DeepSpeed release",
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["deepspeed_zeropp", "deepspeed_zeropp.*"]),
    python_requires=">=3.9",
    install_requires=requirements("runtime.txt"),
    extras_require={
        "deepspeed": requirements("deepspeed.txt"),
        "demo": requirements("deepspeed.txt") + requirements("demo.txt"),  # python -m deepspeed_zeropp demo
        "dev": requirements("dev.txt")
    },
    entry_points={"console_scripts": ["deepspeed-zeropp=deepspeed_zeropp.cli:main"]},
    cmdclass=COMMANDS,
    license="Apache-2.0",
)
