import os

import torch

# DeepSpeed picks its accelerator at import time: the CPU one unless this machine has a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
