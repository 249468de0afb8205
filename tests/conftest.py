import os

import pytest
import torch

# DeepSpeed picks its accelerator at import time: the CPU one unless this machine has a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

# Hypothesis keeps its example database and caches in the working directory unless told where: not in the checkout.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(os.path.expanduser("~"), ".cache", "deepspeed_zeropp", "hypothesis"))


@pytest.fixture(scope="session", autouse=True)
def extensions_folder():
    """DeepSpeed's CPU accelerator JIT-builds an op wherever a test starts it (in this process, in ranks, in a
    `simulate` subprocess): into this package's folder for the DeepSpeed under test, not torch's default shared by
    every release, held for the session so that a killed build's leftover lock is cleared first (a job that waits on
    one never ends)."""
    from deepspeed_zeropp.demo.launch import extensions_dir, own_extensions_claimed
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())  # a GPU host's own folder stays as it is
    with own_extensions_claimed() as directory:
        yield directory
