import os

import torch

# DeepSpeed picks its accelerator at import time: the CPU one unless this machine has a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

# Hypothesis keeps its example database and caches in the working directory unless told where: not in the checkout.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(os.path.expanduser("~"), ".cache", "deepspeed_zeropp", "hypothesis"))
