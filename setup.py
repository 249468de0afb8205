"""Build steps of deepspeed_zeropp that pyproject.toml (metadata, requirements, entry points) cannot declare: csrc/
shipped inside the package, and deepspeed_zeropp.pth (DEEPSPEED_ZEROPP=1) at the site-packages root, for regular
installs (``pip install .``), PEP 660 editable installs (``pip install -e .``) and legacy ``setup.py develop``."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "deepspeed_zeropp.pth"


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

setup(cmdclass=COMMANDS)
