"""Kernel benchmark entry point in the benchmarks folder; the benchmark itself is deepspeed_zeropp.bench
(also ``python -m deepspeed_zeropp bench``)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deepspeed_zeropp.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
