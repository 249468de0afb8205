"""A small multi-rank ZeRO-3 training harness: the demo's main job and the distributed tests' workhorse.

``launch.run_job`` starts one process per rank (CPU gloo by default), each running ``worker`` on a job spec;
rank 0 returns per-step losses, the dtypes seen at every forward, and counters proving quantization ran.
"""
