import os

# DeepSpeed picks its accelerator at import time; every CPU test runs on its CPU accelerator.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
