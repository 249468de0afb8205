"""One CPU ZeRO-3 qwZ training step in a process that stands for every rank of an 8-rank job through torch's
``fake`` process group over its ``FakeStore`` (tests/fake_world.py): the agreement check has no peers to ask and
does not run (the store implements no key-value call: asking it used to stop the first quantize with torch's
"Not implemented"), rank 0 says so in one line, and the gathers really go quantized, in packets, with every
parameter handed back in its own dtype."""
import math

from harness.launch import ROOT, run_ranks

WORLD = 8


def test_qwz_step_under_the_fake_backend_quantizes_and_keeps_the_dtype():
    spec = {
        "model": "padded",  # bf16 throughout; its odd sizes leave padded partitions at 8 ranks
        "dtype": "bf16",
        "patch": True,
        "steps": 1,
        "seed": 0,
        "world_size": WORLD,
        "runs": [{
            "name": "qwZ",
            "quantized": True
        }],
        "instruments": ["tests.fetch_instruments", "tests.fake_world"],  # fetch_instruments first: see its doc
    }
    result = run_ranks("tests.fake_world", spec, world_size=1, timeout=300, device="cpu", paths=[ROOT])
    run = result["runs"]["qwZ"]
    assert "error" not in run, run.get("traceback", run)
    assert run["world"] == ["fake", WORLD, 0]
    assert run["zeropp_log"].count(
        f"deepspeed_zeropp: torch.distributed runs the 'fake' backend ({WORLD} ranks stood for by this process, no "
        f"peers): the check that every rank runs the patch alike does not run") == 1, run["zeropp_log"]
    assert len(run["losses"]) == 1 and math.isfinite(run["losses"][0]), run["losses"]
    counts, sent = run["counts"], run["collectives"]
    assert counts.get("quantize", 0) > 0 and counts.get("dequantize", 0) > 0, counts
    assert counts.get("quantized_single_gathers", 0) + counts.get("quantized_bucket_gathers", 0) > 0, counts
    # every all-gather of the step carried a packet of int8 codes and their scales, none sent bf16 weights
    assert sent.get("all_gathers", 0) > 0 and sent.get("uint8") == sent["all_gathers"], sent
    assert run["packets"].get("packet_all_gathers") == sent["all_gathers"], run["packets"]
    # every forward saw its parameters in their own dtype (bf16); values are not compared: the fake group hands
    # back this rank's shard for every rank's, so the gathered weights are not the model's
    assert run["forward_checks"] > 0 and run["dtype_errors"] == [], run["dtype_errors"]
