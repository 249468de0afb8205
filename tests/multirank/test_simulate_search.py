"""``simulate --search`` end to end on CPU (about 25 s): rank 0 of 2 nodes of 2 with the real DeepSpeed and the patch,
the user's config (HF "auto" sizes) as the baseline, a two-value prefetch grid and hpZ's partition size searched for
qwZ+qgZ+hpZ and unquantized, through the real runner; the block printed is valid JSON, stage 3, with the flags of
the configuration it names, and the JSON file holds the same answer."""
import json
import os
import subprocess
import sys


def test_search_of_two_nodes_of_two(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(
        json.dumps({
            "train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {
                "stage": 3,
                "reduce_bucket_size": "auto",
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
            }
        }))
    path = tmp_path / "search.json"
    command = [
        sys.executable, "-m", "deepspeed_zeropp", "simulate", "--model", "tiny", "--gpus-per-node", "2", "--nodes",
        "2", "--configs", "ours-qwz-qgz-hpz", "--reps", "1", "--steps", "1", "--warmup", "1", "--reuse-distance", "0",
        "--device", "cpu", "--deepspeed-config",
        str(ds), "--search", "--grid", "stage3_prefetch_bucket_size=auto,5e7", "zero_hpz_partition_size=2",
        "--budget-minutes", "5", "--json",
        str(path)
    ]
    done = subprocess.run(command,
                          capture_output=True,
                          text=True,
                          timeout=300,
                          env=dict(os.environ, DS_ACCELERATOR="cpu"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "search 3/3: zero_hpz_partition_size for ours qwZ+qgZ+hpZ, 1 runs" in out
    assert "left unexplored" not in out
    block, _ = json.JSONDecoder().raw_decode(out[out.index('{\n  "zero_optimization"'):])
    zero = block["zero_optimization"]
    assert zero["stage"] == 3 and zero["reduce_bucket_size"] == 64 * 64
    assert zero["stage3_prefetch_bucket_size"] in (int(0.9 * 64 * 64), 50_000_000)
    answer, = json.loads(path.read_text())["answers"]
    assert answer["interleaved"] and answer["baseline"]["config"] == "unquantized"
    assert answer["baseline"]["settings"] == {
        "reduce_bucket_size": 4096,
        "stage3_prefetch_bucket_size": 3686,
        "stage3_param_persistence_threshold": 640
    }
    quantized = "zero_quantized_weights" in zero
    assert (answer["best"]["config"] == "ours-qwz-qgz-hpz") == quantized
    if quantized:
        assert zero["zero_quantized_gradients"] and zero["zero_hpz_partition_size"] == 2
