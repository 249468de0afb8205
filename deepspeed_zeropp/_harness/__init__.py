"""The multi-rank ZeRO-3 training harness behind the demo and the benchmark scripts; not a public API.

``launch.run_job`` starts one process per rank (CPU gloo by default), each running ``worker`` on a job spec;
rank 0 returns per-step losses, the dtypes seen at every forward, and counters proving quantization ran. What else a
job measures comes from instrument modules the spec names (worker.py describes the hooks).
"""
