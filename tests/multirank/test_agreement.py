"""Every rank runs the patch, or the job stops: real 2-rank ZeRO-3 jobs over gloo (agreement.py).

A job with only rank 0 patched (qwZ, qgZ or MixZ++) stops before its first training step, with the error naming rank
1; a fully patched job trains exactly as without the check, with the same collectives, the check costing one wait on
the store."""
import socket
import time

import pytest

from harness.launch import run_job
from deepspeed_zeropp.formats import WIRE_FORMAT_VERSION

BOUND = 10  # seconds: DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT of the mixed job

# The ZeRO++ flag of each mixed job, and ranks per node (qgZ runs between nodes only: 2 nodes of 1 rank). The first
# quantized data rank 0 makes: qwZ at the first fetch of step 0's forward, qgZ at step 0's gradient reduction,
# MixZ++ when the engine partitions the frozen weights, before any step.
FLAGS = {"qwZ": ("quantized", 2), "qgZ": ("quantized_gradients", 1), "MixZ++": ("quantized_nontrainable", 2)}


@pytest.mark.parametrize("flag", list(FLAGS))
def test_job_with_one_rank_unpatched_stops_before_its_first_step(tmp_path, flag):
    key, local_size = FLAGS[flag]
    spec = {
        "model": "padded",
        "dtype": "bf16",
        "patch": True,
        "steps": 2,
        "runs": [{
            "name": "mixed",
            key: True,
            "patch_ranks": [0]
        }],
        "instruments": "tests.agreement_instruments"
    }
    start = time.monotonic()
    result = run_job(spec,
                     world_size=2,
                     local_size=local_size,
                     timeout=600,
                     env={
                         "DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT": str(BOUND),
                         "AGREEMENT_STEPS_DIR": str(tmp_path)
                     })
    elapsed = time.monotonic() - start
    run = result["runs"]["mixed"]
    assert run.get("error", "").startswith("AgreementError: deepspeed_zeropp: rank 0 of 2 stops before its first "
                                           "quantized collective"), run
    error = run["error"]
    assert (f"rank 0 (host {socket.gethostname()}): deepspeed_zeropp " in error
            and f"wire format {WIRE_FORMAT_VERSION}, backend auto (native), codes and scales in one packet [this rank]"
            in error), error
    assert f"rank 1 (host unknown): no answer within {BOUND} s" in error and ".deepspeed_env" in error, error
    steps = {rank: (tmp_path / f"rank{rank}.steps") for rank in (0, 1)}
    steps = {rank: path.read_text().split() if path.exists() else [] for rank, path in steps.items()}
    assert all(started in ([], ["0"]) for started in steps.values()), steps  # no rank finished a step
    assert steps[0] == ([] if flag == "MixZ++" else ["0"]), steps
    assert elapsed < BOUND + 300, elapsed  # the bound, not the harness's timeout, ended it


def test_fully_patched_job_trains_as_without_the_check():
    """qwZ and qgZ (2 ranks as 2 nodes): the same losses bit for bit and the same collectives as a run whose check
    does nothing; the check's only traffic is two sets and one wait on the store."""
    both = {"quantized": True, "quantized_gradients": True}
    runs = [dict(both, name="unchecked", agreement="off"), dict(both, name="checked", agreement="on")]
    spec = {"model": "padded", "dtype": "bf16", "patch": True, "steps": 3, "runs": runs}
    spec["instruments"] = "tests.agreement_instruments"
    result = run_job(spec, world_size=2, local_size=1, timeout=600)
    unchecked, checked = result["runs"]["unchecked"], result["runs"]["checked"]
    for run in (unchecked, checked):
        assert "error" not in run, run.get("traceback", run)
        assert run["counts"].get("quantize", 0) > 0 and run["counts"].get("quantized_gradient_reductions", 0) > 0
    assert len(checked["losses"]) == 3 and checked["losses"] == unchecked["losses"]
    assert checked["collectives"] == unchecked["collectives"] and checked["collectives"], checked["collectives"]
    assert unchecked["store_calls"] == {} and checked["store_calls"] == {"set": 2, "wait": 1}, checked["store_calls"]
