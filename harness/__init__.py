"""The multi-rank ZeRO-3 training harness of the tests and the benchmarks (not shipped: the wheel holds the package
deepspeed_zeropp alone, whose demo keeps a small worker of its own, with its checks and the stand-in for DeepSpeed's
op: the harness builds on those).

``launch.run_job`` starts one process per rank (CPU gloo by default), each running ``worker`` on a job spec;
rank 0 returns per-step losses, the dtypes seen at every forward, and counters proving quantization ran. What else a
job measures comes from instrument modules the spec names (worker.py describes the hooks).
"""
