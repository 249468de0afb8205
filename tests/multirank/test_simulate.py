"""The simulated world's CPU smoke: ``python -m deepspeed_zeropp simulate`` runs rank 0 of a 4-rank job (2 nodes
of 2) with the real DeepSpeed and the patch, unquantized, qwZ+qgZ and qwZ+qgZ+hpZ; every quantized path ran (byte
packets gathered across and inside nodes, 4-bit all-to-alls at both stages), no step was skipped, and the first
loss with quantized weights is the unquantized one within int8 rounding (the gathered weights are what a real rank
would gather if every rank held this one's partition)."""
import json
import os
import subprocess
import sys


def test_smoke_of_two_nodes_of_two(tmp_path):
    path = tmp_path / "smoke.json"
    command = [
        sys.executable, "-m", "deepspeed_zeropp", "simulate", "--model", "tiny", "--gpus-per-node", "2", "--nodes",
        "2", "--configs", "unquantized", "ours-qwz-qgz", "ours-qwz-qgz-hpz", "--reps", "1", "--steps", "2", "--warmup",
        "1", "--micro-batch", "2", "--reuse-distance", "0", "--device", "cpu", "--json",
        str(path)
    ]
    done = subprocess.run(command,
                          capture_output=True,
                          text=True,
                          timeout=300,
                          env=dict(os.environ, DS_ACCELERATOR="cpu"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every run: no skipped step, finite losses, its quantized paths ran" in done.stdout
    results = json.loads(path.read_text())
    assert results["problems"] == [] and results["topology"] == {"world_size": 4, "gpus_per_node": 2, "nodes": 2}
    plain, ours = (results["reps"][0][key] for key in ("unquantized", "ours-qwz-qgz-hpz"))
    for run in (plain, ours):
        assert run["skipped_steps"] == 0 and run["finite"]
    assert set(ours["by_link"]["free"]["phase_ms"]) == {"forward", "backward", "step"}
    counts = ours["by_link"]["free"]["collectives"]
    for kind in ("all_gather/uint8/inter", "all_gather/uint8/intra", "all_to_all/uint8/inter",
                 "all_to_all/uint8/intra"):
        assert counts.get(kind, 0) > 0, (kind, counts)
    assert not any("int8" in kind for kind in plain["by_link"]["free"]["collectives"])
    first = {key: run["warmup_losses"][0] for key, run in results["runs"].items()}
    assert abs(first["ours-qwz-qgz"] - first["unquantized"]) < 0.01, first


def test_one_node_on_cpu_does_not_wait_for_absent_ranks(tmp_path):
    """One node: every simulated rank is local, where DeepSpeed's CPU backend would wait for its peers' shared memory
    if the world told it the node's size (world.install leaves LOCAL_SIZE out)."""
    command = [
        sys.executable, "-m", "deepspeed_zeropp", "simulate", "--model", "tiny", "--gpus-per-node", "2", "--nodes",
        "1", "--configs", "unquantized", "ours-qwz", "--reps", "1", "--steps", "1", "--warmup", "1", "--device", "cpu"
    ]
    done = subprocess.run(command,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          env=dict(os.environ, DS_ACCELERATOR="cpu", LOCAL_SIZE="2"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every run: no skipped step, finite losses, its quantized paths ran" in done.stdout
