"""The simulated world's parts without DeepSpeed: the link model's ring costs, the topology's link classes, the
store that answers for the simulated ranks, the values each collective hands back (as if every rank held what
this one holds), and the runner's phase clock."""
import gc
import time

import pytest
import torch
from torch.distributed import ReduceOp, ReduceScatterOptions

from deepspeed_zeropp.simulate import link, world


@pytest.fixture
def topology(monkeypatch):
    monkeypatch.setattr(world.STATE, "topology", world.Topology(8, 4))
    world.reset_counts()
    yield world.STATE.topology
    world.reset_counts()


def test_ring_costs():
    fast, slow = link.LinkClass(2.0, 8 * 100.0), link.LinkClass(10.0, 8.0)
    model = link.Link(fast, slow)
    n, size = 4, 1 << 20
    assert link.wire_bytes("all_gather", size, n) == size * 3 / 4
    assert link.wire_bytes("all_reduce", size, n) == size * 3 / 2
    assert link.wire_bytes("broadcast", size, n) == size
    assert model.seconds("all_gather", size, n, "intra") == pytest.approx(3 * 2e-6 + size * 3 / 4 / 100e9)
    assert model.seconds("all_reduce", size, n, "inter") == pytest.approx(6 * 10e-6 + size * 3 / 2 / 1e9)
    assert model.seconds("barrier", 0, n, "inter") == pytest.approx(6 * 10e-6)
    assert model.seconds("all_to_all", size, n, "inter") == pytest.approx(3 * 10e-6 + size * 3 / 4 / 1e9)


def test_a_ring_across_nodes_uses_every_nic_of_its_ranks_there():
    """A world-wide ring of 16 ranks on 2 nodes crosses the network on 2 of its edges and sends through the 8 NICs
    of each node: 8 times one GPU's NIC, never more than NVLink; an all-to-all sends its peers on other nodes'
    shares through its own NIC, the rest over NVLink."""
    fast, slow = link.LinkClass(2.0, 8 * 100.0), link.LinkClass(10.0, 8.0)
    model = link.Link(fast, slow)
    size = 1 << 24
    ring = size * 15 / 16
    assert model.seconds("all_gather", size, 16, "inter",
                         nodes=2) == pytest.approx((2 * 10 + 13 * 2) * 1e-6 + ring / 8e9)
    assert model.seconds("reduce_scatter", size, 16, "inter", nodes=2) == model.seconds("all_gather",
                                                                                        size,
                                                                                        16,
                                                                                        "inter",
                                                                                        nodes=2)
    assert model.seconds("all_reduce", size, 16, "inter",
                         nodes=2) == pytest.approx(2 * (2 * 10 + 13 * 2) * 1e-6 + 2 * ring / 8e9)
    assert model.seconds("all_gather", size, 16, "inter", nodes=16) == model.seconds("all_gather", size, 16, "inter")
    wide = link.Link(fast, link.LinkClass(10.0, 8 * 400.0))  # NICs so fast that NVLink bounds the ring
    assert model.seconds("all_gather", size, 16, "inter", nodes=2) > wide.seconds(
        "all_gather", size, 16, "inter", nodes=2) == pytest.approx((2 * 10 + 13 * 2) * 1e-6 + ring / 100e9)
    assert model.seconds("all_to_all", size, 16, "inter", nodes=2) == pytest.approx(15 * 10e-6 + size * 8 / 16 / 1e9)


def test_groups_know_the_nodes_they_span(topology):
    assert world.SimulatedGroup(0, 8, range(8)).nodes == 2
    assert world.SimulatedGroup(0, 4, [0, 1, 2, 3]).nodes == 1
    assert world.SimulatedGroup(0, 2, [1, 5]).nodes == 2


def test_topology_link_classes():
    topology = world.Topology(16, 8)
    assert topology.nodes == 2
    assert topology.link_class(range(8)) == "intra" and topology.link_class([7, 8]) == "inter"
    for bad in (world.Topology(1, 1), world.Topology(12, 8), world.Topology(8, 0)):
        with pytest.raises(ValueError, match="gpus_per_node divides"):
            bad.check()


def test_store_answers_for_every_rank():
    store = world.MirrorStore(3)
    store.set("check/3/rank0", "ours")
    store.set("check/3/token/rank0", "1")
    assert store.get("check/3/rank2") == b"ours" and store.check(["check/3/token/rank1", "check/3/token/rank2"])
    store.set("other", "x")
    assert not store.check(["other/rank1"])
    with pytest.raises(RuntimeError, match="only rank 0 runs"):
        store.wait(["never/set"])
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5


def test_collectives_hand_back_every_rank_as_this_one(topology):
    group = world.SimulatedGroup(1, 4, [0, 1, 2, 3])
    x = torch.arange(6, dtype=torch.float32)
    out = torch.empty(24)
    group.all_gather_single(out, x).wait()
    assert torch.equal(out.view(4, 6), x.expand(4, 6))
    gathered = torch.zeros(24)  # in place: the input is this rank's slot of the output, as DeepSpeed gathers
    gathered[6:12] = x
    group.all_gather_single(gathered, gathered[6:12]).wait()
    assert torch.equal(gathered.view(4, 6), x.expand(4, 6))
    summed = x.clone()
    group.allreduce([summed]).wait()
    assert torch.equal(summed, 4 * x)
    grads = torch.arange(8, dtype=torch.bfloat16)
    mine = torch.empty(2, dtype=torch.bfloat16)
    group.reduce_scatter_single(mine, grads).wait()  # rank 1's chunk, from 4 ranks alike
    assert torch.equal(mine, 4 * grads[2:4])
    averaged = torch.empty(2, dtype=torch.bfloat16)
    options = ReduceScatterOptions()
    options.reduceOp = ReduceOp.AVG
    group.reduce_scatter_single(averaged, grads, options).wait()
    assert torch.equal(averaged, grads[2:4])
    blocks = torch.arange(8, dtype=torch.uint8)
    received = torch.empty(8, dtype=torch.uint8)
    group.all_to_all_single(received, blocks, [], []).wait()  # every peer sends what rank 1 sends itself
    assert torch.equal(received.view(4, 2), blocks.view(4, 2)[1].expand(4, 2))
    group.all_to_all_single(received, blocks, [2, 2, 2, 2], [1, 3, 2, 2]).wait()  # uneven: rank 1 sends 3 values
    assert torch.equal(received.view(4, 2), blocks[1:3].expand(4, 2))
    assert world.STATE.counts == {
        ("all_gather", "float32", "intra"): 2,
        ("all_reduce", "float32", "intra"): 1,
        ("reduce_scatter", "bfloat16", "intra"): 2,
        ("all_to_all", "uint8", "intra"): 2
    }
    assert world.STATE.wire_bytes["intra"] == 2 * 72 + 36 + 2 * 12 + 2 * 6


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "0"], "--nodes 0: accepted: an integer >= 1"),
    (["--gpus-per-node", "1", "--nodes", "1"], "a world of 1 rank; accepted: 2 or more ranks"),
    (["--inter-gbps", "-5", "--device", "cpu"], "--inter-gbps -5: accepted: link speeds > 0 Gbit/s"),
    (["--model", "tiny", "--nodes", "2", "--configs", "ours-qwz-qgz-hpz", "--device", "cpu"],
     "--configs ours-qwz-qgz-hpz: none can run in this world (ours-qwz-qgz-hpz: hpZ's node-local copy would never"),
])
def test_simulate_names_bad_arguments(argv, message, capsys):
    from deepspeed_zeropp import cli
    assert cli.main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().out


def test_phase_clock_times_each_phase_and_forgets_them_when_taken():
    from deepspeed_zeropp.simulate import runner, timeline
    clock = runner.PhaseClock(cuda=False)
    with clock(timeline.PHASE_MARK + "forward"):
        time.sleep(0.02)
    with clock(timeline.PHASE_MARK + "backward"):
        pass
    first = clock.take()
    assert list(first) == ["forward", "backward"] and first["forward"]["host_ms"] >= 20
    assert first["backward"]["host_ms"] < first["forward"]["host_ms"] and "device_ms" not in first["forward"]
    assert first["forward"]["thread_ms"] < 10  # asleep: the host's window, not the thread's CPU time
    assert first["forward"]["involuntary_switches"] >= 0
    with clock(timeline.PHASE_MARK + "forward"):
        spin = time.thread_time() + 0.02
        while time.thread_time() < spin:
            pass
    busy = clock.take()["forward"]
    assert busy["thread_ms"] >= 20 and busy["host_ms"] >= busy["thread_ms"] - 1
    assert clock.take() == {}
    steps = [{"forward": {"host_ms": ms}} for ms in (3.0, 1.0, 2.0)]
    assert runner._median_phases(steps) == {"forward": {"host_ms": 2.0}}


def test_cores_busy_counts_this_process_and_the_machine():
    from deepspeed_zeropp.simulate import runner
    before = runner._cpu_load()
    spin = time.thread_time() + 0.2
    while time.thread_time() < spin:
        pass
    after = runner._cpu_load()
    busy = runner._cores_busy(before, after)
    assert after[1] - before[1] >= 0.2 and busy["this_process"] < 1.5  # one thread spinning, whatever else runs
    assert busy["machine"] is None or busy["machine"] > 0.5 * busy["this_process"]  # in the kernel's 10 ms ticks
    assert runner._cores_busy((0.0, 0.0, None), (2.0, 1.0, None)) == {"this_process": 0.5, "machine": None}


def test_garbage_clock_counts_the_collections_inside_it_only():
    from deepspeed_zeropp.simulate import runner
    gc.collect()
    with runner.GarbageClock() as garbage:
        gc.collect()
        gc.collect(0)
    gc.collect()
    figures = garbage.figures(steps=2)
    assert garbage.collections == 2 and figures["gc_collections_per_step"] == 1
    assert 0 < figures["gc_ms_per_step"] and figures["gc_tracked_objects"] > 1000
    assert garbage._note not in gc.callbacks


def test_allocator_counts_read_the_caching_allocators_counters(monkeypatch):
    from deepspeed_zeropp.simulate import runner
    stats = {"num_alloc_retries": 1, "num_device_alloc": 7, "num_device_free": 3, "num_ooms": 5}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: stats)
    assert runner._allocator_counts(cuda=True) == {
        "alloc_retries_per_step": 1,
        "device_mallocs_per_step": 7,
        "device_frees_per_step": 3
    }
    assert runner._allocator_counts(cuda=False) == dict.fromkeys(runner.ALLOCATOR_COUNTS, 0)


def test_the_recommendation_is_a_configuration_the_user_runs():
    """Upstream's configurations and ours with a seam left out are measured to compare with, never recommended,
    even where the spread of a host-bound step makes one of them the fastest."""
    from deepspeed_zeropp.simulate import report

    def rows(**medians):
        return {"link": {key.replace("_", "-"): {"step_ms": {"median": ms}} for key, ms in medians.items()}}

    table = rows(unquantized=900,
                 ours_qwz_qgz_hpz=520,
                 ours_qwz_qgz_hpz_one_reduce_stream=500,
                 upstream_qwz_qgz_hpz=510,
                 ours_qwz_qgz_hpz_step_writes=505)
    best, flags = report.recommend(table, "link")
    assert best == "ours-qwz-qgz-hpz" and flags["zero_hpz_partition_size"] == "GPUs per node"
    assert report.recommend(rows(unquantized=400, ours_qwz=410, upstream_qwz=390), "link")[0] == "unquantized"


def test_other_cores_is_the_busiest_links_load_from_other_processes():
    from deepspeed_zeropp.simulate import report

    def block(*loads):
        return {
            "by_link": {
                f"link {i}": {
                    "cores_busy": {
                        "this_process": own,
                        "machine": machine
                    }
                }
                for i, (own, machine) in enumerate(loads)
            }
        }

    results = {"reps": [{"a": block((1.0, 1.1), (1.0, 3.5))}, {"a": block((1.0, 1.0)), "b": block((2.0, None))}]}
    assert report.other_cores(results) == 2.5
    assert report.other_cores({"reps": [{"b": block((2.0, None))}]}) is None
    assert report.other_cores({"reps": [{"a": {"by_link": {"old": {"median_ms": 1.0}}}}]}) is None
