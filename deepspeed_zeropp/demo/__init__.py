"""``python -m deepspeed_zeropp demo``: a 2-rank ZeRO-3 bf16 job with zero_quantized_weights, without and with the
patch (command.py), on a small worker of its own (worker.py) started one process per rank (launch.py)."""
from .command import run

__all__ = ["run"]
