"""ZeRO-3 at N ranks on one device: this process runs rank 0 of a simulated world (``world``) whose collectives
cost a modelled link time (``link``), and trains each ZeRO++ configuration of a GPT (``model``) side by side
(``runner``). ``python -m deepspeed_zeropp simulate`` is its command line."""
