"""The simulated world on a GPU: collectives wait for the caller's stream, their work makes the waiter wait for
them, modelled delays land on the timeline, and a real ZeRO-3 job runs in it (tests/unit/test_simulate.py runs the
CPU smoke)."""
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    from deepspeed_zeropp.simulate import link, world
    world.install(8, 4, "cuda")
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    out = torch.empty(8 << 20, device="cuda")
    # The caller's stream is busy; the gather must start after it, and the waiter must see its result.
    torch.cuda._sleep(50_000_000)
    x.add_(1)
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    work.wait()
    assert torch.equal(out.view(8, -1), (torch.arange(1 << 20, device="cuda") + 1).float().expand(8, -1))
    # A modelled delay: a 256 MiB all-gather over the 4 ranks of a node at 100 Gbit/s: 3/4 * 256 MiB / 12.5 GB/s.
    slow = link.Link(link.LinkClass(0.0, 100.0), link.LinkClass(0.0, 100.0))
    world.set_link(slow)
    big_in = torch.empty(16 << 20, device="cuda")
    group = dist.new_group([0, 1, 2, 3])
    big_out4 = torch.empty(64 << 20, device="cuda")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dist.all_gather_into_tensor(big_out4, big_in, group=group)
    end.record()
    end.synchronize()
    expected = slow.seconds("all_gather", big_out4.numel() * 4, 4, "intra") * 1e3
    measured = start.elapsed_time(end)
    print("modelled", expected, "measured", measured)
    assert expected * 0.97 < measured < expected * 1.03 + 0.5, (measured, expected)  # + the host's own latency
    assert world.STATE.counts[("all_gather", "float32", "intra")] == 1
    print("OK")
""")


def test_streams_and_delays():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr[-3000:]


WAITED_SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    from deepspeed_zeropp.simulate import link, timeline, world
    world.install(8, 4, "cuda")
    slow = link.Link(link.LinkClass(0.0, 100.0), link.LinkClass(0.0, 100.0))
    world.set_link(slow)
    group = dist.new_group([0, 1, 2, 3])
    x, out = torch.empty(16 << 20, device="cuda"), torch.empty(64 << 20, device="cuda")
    a = torch.randn(1024, 1024, device="cuda")
    modelled = slow.seconds("all_gather", out.numel() * 4, 4, "intra") * 1e9  # ns, ~16 ms

    def measure(host_bound):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            a @ a
            dist.all_gather_into_tensor(out, x, group=group, async_op=True).wait()  # the stream waits for it
            if host_bound:
                torch.cuda.synchronize()  # the host is late: the next work is launched after the collective
            a @ a
            torch.cuda.synchronize()
        activities = timeline.from_profile(prof.events())
        return timeline.exposure(activities, timeline.communication_streams(activities))

    measure(False)  # warm-up: the first profile of a process pays its own start
    waiting, late = measure(False), measure(True)
    print("waiting", waiting, "late", late, "modelled", modelled)
    assert waiting.exposed > 0.8 * modelled and late.exposed > 0.8 * modelled
    assert waiting.waited is not None and waiting.waited > 0.9 * waiting.exposed
    assert late.waited is not None and late.waited < 0.05 * late.exposed
    print("OK")
""")


def test_waited_communication_from_a_real_profile():
    """The waited figure reads launch times from a real profile: compute launched behind a collective waited for
    all of it; compute launched only after the collective ended (a late host) waited for none of it."""
    result = subprocess.run([sys.executable, "-c", WAITED_SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr[-3000:]
