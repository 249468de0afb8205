"""The simulated world's exposed- and waited-communication figures: interval arithmetic on synthetic GPU timelines
(integer times, exact results), the communication streams found by the sleep kernel, and profiler events read into
activities (launch times included)."""
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from deepspeed_zeropp.simulate import timeline
from deepspeed_zeropp.simulate.timeline import Activity, Exposure

COMPUTE, COMM, COMM2 = 7, 20, 24  # stream ids as the profiler gives them
SLEEP = "at::cuda::(anonymous namespace)::spin_kernel(long)"


def kernel(stream, start, end, name="gemm", device=0, launched=None):
    return Activity(device, stream, start, end - start, name, launched)


def collective(stream, start, end, device=0, launched=None):
    return kernel(stream, start, end, SLEEP, device, launched)


def test_union_and_difference_of_intervals():
    assert timeline.merged([(5, 9), (0, 3), (2, 4), (9, 10), (6, 7), (8, 8)]) == [(0, 4), (5, 10)]
    assert timeline.length([(0, 10), (2, 3), (20, 25)]) == 15
    assert timeline.uncovered([(0, 10)], [(2, 3), (5, 12)]) == 4
    assert timeline.uncovered([(0, 10), (4, 6)], []) == 10
    assert timeline.uncovered([], [(0, 10)]) == 0
    assert timeline.overlapped([[(0, 10)], [(5, 15)], [(8, 9), (30, 40)]]) == 5
    assert timeline.overlapped([[(0, 10)], [(5, 15)], [(8, 9)]], at_least=3) == 1
    assert timeline.overlapped([[(0, 10)], [(10, 20)]]) == 0  # touching: never both at once


@pytest.mark.parametrize(
    "activities, expected",
    [
        ([], Exposure(0, 0, 0)),  # nothing ran
        ([kernel(COMPUTE, 0, 100)], Exposure(0, 0, 0)),  # compute only
        ([collective(COMM, 0, 50)], Exposure(50, 50, 0)),  # nothing to hide behind
        # disjoint: all of it exposed
        ([kernel(COMPUTE, 0, 10), collective(COMM, 20, 30),
          kernel(COMPUTE, 40, 50)], Exposure(10, 10, 0)),
        # nested in compute: hidden
        ([kernel(COMPUTE, 0, 100), collective(COMM, 20, 30)], Exposure(0, 10, 0)),
        # overlapping both ends: [0, 5) and [30, 40) exposed
        ([collective(COMM, 0, 40), kernel(COMPUTE, 5, 20),
          kernel(COMPUTE, 15, 30)], Exposure(15, 40, 0)),
        # the collective's copy and its sleep on one stream are one collective; touching compute hides nothing more
        ([kernel(COMM, 0, 4, "copy"), collective(COMM, 4, 20),
          kernel(COMPUTE, 20, 30)], Exposure(20, 20, 0)),
        # two communication streams: their union counts once, the time both run is concurrent
        ([collective(COMM, 0, 30), collective(COMM2, 20, 50),
          kernel(COMPUTE, 25, 45)], Exposure(30, 50, 10)),
        # a side stream's kernel (not communication) hides a collective as the compute stream's does
        ([collective(COMM, 0, 30), kernel(COMPUTE, 0, 10),
          kernel(9, 10, 20, "copy")], Exposure(10, 30, 0)),
    ])
def test_exposure(activities, expected):
    streams = timeline.communication_streams(activities)
    found = timeline.exposure(activities, streams)
    assert found[:3] == expected[:3]
    # launch times unknown: waited is unknown wherever compute ran (else nothing waited)
    assert found.waited == (None if any(a.stream not in (COMM, COMM2) for a in activities) else 0)


@pytest.mark.parametrize(
    "activities, exposed, waited",
    [
        # host-bound: the compute after the collective was launched only when the collective had ended
        ([kernel(COMPUTE, 0, 10, launched=0),
          collective(COMM, 10, 30),
          kernel(COMPUTE, 40, 50, launched=35)], 20, 0),
        # launched at 15, started at 40: held back from 15 to 30 while the collective ran (30-40: no collective)
        ([kernel(COMPUTE, 0, 10, launched=0),
          collective(COMM, 10, 30),
          kernel(COMPUTE, 40, 50, launched=15)], 20, 15),
        # launched before the stretch began: the whole stretch under the collective is waited
        ([kernel(COMPUTE, 0, 10, launched=0),
          collective(COMM, 5, 30),
          kernel(COMPUTE, 30, 50, launched=2)], 20, 20),
        # several activities start the next stretch: the earliest launched of them counts
        ([
            kernel(COMPUTE, 0, 10, launched=0),
            collective(COMM, 10, 30),
            kernel(COMPUTE, 30, 40, launched=25),
            kernel(9, 30, 35, "copy", launched=12)
        ], 20, 18),
        # the first stretch of the profile: from the launch of the first compute
        ([collective(COMM, 0, 30), kernel(COMPUTE, 30, 40, launched=10)], 30, 20),
    ])
def test_waited(activities, exposed, waited):
    found = timeline.exposure(activities, timeline.communication_streams(activities))
    assert (found.exposed, found.waited) == (exposed, waited)
    assert found.waited <= found.exposed


def test_waited_per_device_and_unknown_launch():
    activities = [
        kernel(COMPUTE, 0, 10, launched=0),
        collective(COMM, 10, 30),
        kernel(COMPUTE, 30, 40, launched=10),
        kernel(COMPUTE, 0, 10, device=1, launched=0),
        collective(COMM, 10, 20, device=1),
        kernel(COMPUTE, 20, 30, device=1, launched=18)
    ]
    found = timeline.exposure(activities, timeline.communication_streams(activities))
    assert (found.exposed, found.waited) == (30, 22)
    # a stretch ended by compute of unknown launch (queued before the profile) counts nothing; none known: None
    unknown = activities[:-1] + [kernel(COMPUTE, 20, 30, device=1)]
    assert timeline.exposure(unknown, timeline.communication_streams(unknown)).waited == 20
    none_known = [a._replace(launched=None) for a in activities]
    assert timeline.exposure(none_known, timeline.communication_streams(none_known)).waited is None


def test_exposure_per_device():
    # compute on device 1 hides nothing of device 0's collective; a stream id is a stream of its device only
    activities = [collective(COMM, 0, 10), kernel(COMPUTE, 0, 10, device=1), kernel(COMM, 0, 10, device=1)]
    streams = timeline.communication_streams(activities)
    assert streams == {(0, COMM)}
    assert timeline.exposure(activities, streams) == Exposure(10, 10, 0)


def _event(name, stream, start_us, end_us, device_type=DeviceType.CUDA, kind="kernel", id=0):
    return SimpleNamespace(id=id,
                           name=name,
                           device_type=device_type,
                           device_index=0,
                           device_resource_id=stream,
                           thread=1,
                           activity_type=kind,
                           time_range=SimpleNamespace(start=start_us, end=end_us))


def test_figures_from_profiler_events():
    events = [
        _event("aten::mm", 1, 0.0, 100.0, DeviceType.CPU, "cpu_op"),  # host side: not on the GPU timeline
        _event("gemm", COMPUTE, 0.0, 1000.0),
        _event("Memcpy DtoD (Device -> Device)", COMM, 500.0, 1500.0, kind="gpu_memcpy"),  # a collective's copy
        _event(SLEEP, COMM, 1500.0, 3500.0),
        _event("Optimizer.step#AdamW.step", COMPUTE, 0.0, 4000.0, kind="gpu_user_annotation"),  # a marker, no work
        _event("gemm", COMPUTE, 3000.0, 4000.0),
    ]
    assert timeline.from_profile(events)[0] == Activity(0, COMPUTE, 0, 1_000_000, "gemm")
    assert timeline.figures(events, steps=2) == {
        "exposed_comm_ms_per_step": 1.0,  # [1000, 3000) us over 2 steps
        "comm_waited_ms_per_step": None,  # no runtime calls: launch times unknown
        "comm_ms_per_step": 1.5,
        "comm_concurrent_ms_per_step": 0.0,
    }
    no_link = [e for e in events if e.name != SLEEP]  # a free link: copies only, no communication stream known
    assert set(timeline.figures(no_link, steps=2).values()) == {None}


def test_phase_ranges_mirrored_on_the_device_are_no_work():
    """torch 2.11 mirrors the host's phase ranges onto the streams they launched work on, with no activity type:
    counted as compute, forward's range would hide every collective of forward."""
    events = [
        _event(timeline.PHASE_MARK + "forward", COMPUTE, 0.0, 4000.0, kind=None),
        _event(timeline.PHASE_MARK + "forward", COMM, 0.0, 4000.0, kind=None),
        _event("ProfilerStep#1", COMPUTE, 0.0, 4000.0, kind=None),
        _event("gemm", COMPUTE, 0.0, 1000.0, kind=None),
        _event(SLEEP, COMM, 1000.0, 3000.0, kind=None),
    ]
    events[2].is_user_annotation = True
    assert [a.name for a in timeline.from_profile(events)] == ["gemm", SLEEP]
    assert timeline.figures(events, steps=1)["exposed_comm_ms_per_step"] == 2.0


def test_launch_times_from_runtime_calls():
    cpu = DeviceType.CPU
    events = [
        _event("aten::mm", 1, 0.0, 100.0, cpu, "cpu_op", id=5),  # an op: its id is not a launch's
        _event("cudaLaunchKernel", 1, 10.0, 12.0, cpu, "cuda_runtime", id=5),
        _event("gemm", COMPUTE, 20.0, 1000.0, id=5),
        _event("cudaLaunchKernel", 1, 400.0, 402.0, cpu, "cuda_runtime", id=6),
        _event(SLEEP, COMM, 1000.0, 3000.0, id=7),  # launched before the profile: no runtime call seen
        _event("cudaLaunchKernel", 1, 1500.0, 1502.0, cpu, "cuda_runtime", id=8),
        _event("gemm", COMPUTE, 3000.0, 4000.0, id=8),
        _event("cudaLaunchKernel", 1, 2000.0, 2002.0, cpu, "cuda_runtime", id=9),
        _event("gemm", COMPUTE, 3000.0, 3500.0, id=9),
    ]
    activities = timeline.from_profile(events)
    assert [a.launched for a in activities] == [10_000, None, 1_500_000, 2_000_000]
    assert timeline.figures(events, steps=2)["comm_waited_ms_per_step"] == 0.75  # [1500, 3000) us over 2 steps


def test_waited_by_the_phase_that_launched_the_compute():
    """Each stretch's wait goes to the host phase in which the compute that waited was launched; a launch outside
    every phase counts under None; the phases' sum is the waited total."""
    activities = [
        kernel(COMPUTE, 0, 10, launched=0),
        collective(COMM, 10, 30),
        kernel(COMPUTE, 30, 40, launched=25),  # waited 5, launched in forward
        collective(COMM, 40, 70),
        kernel(COMPUTE, 70, 80, launched=45),  # waited 25, launched in backward
        kernel(COMPUTE, 0, 10, device=1, launched=0),
        collective(COMM, 10, 20, device=1),
        kernel(COMPUTE, 20, 30, device=1, launched=95),  # launched after the last phase: its wait counts nothing
    ]
    streams = timeline.communication_streams(activities)
    windows = [(28, 60, "backward"), (0, 28, "forward"), (60, 90, "step")]
    found = timeline.waited_by_phase(activities, streams, windows)
    assert found == {"backward": 25, "forward": 5, "step": 0, None: 0}
    assert sum(found.values()) == timeline.exposure(activities, streams).waited
    late = activities[:-1] + [kernel(COMPUTE, 25, 30, device=1, launched=12)]  # waited 8, launched in forward
    assert timeline.waited_by_phase(late, streams, windows)["forward"] == 13
    assert timeline.waited_by_phase(late, streams, [(0, 11, "forward")]) == {"forward": 0, None: 38}


def test_busy_time_by_the_phase_that_launched_it():
    """Collectives and compute count in the phase whose host window holds their launch, each as the union of its
    intervals per device; an unknown launch, or one outside every window, counts under None."""
    activities = [
        kernel(COMPUTE, 0, 10, launched=0),
        collective(COMM, 10, 30, launched=2),
        collective(COMM, 20, 40, launched=3),  # overlaps the one before: their union is 30
        kernel(COMPUTE, 30, 40, launched=25),
        collective(COMM, 40, 70, launched=30),
        kernel(COMPUTE, 70, 80, launched=45),
        kernel(COMPUTE, 0, 10, device=1, launched=5),  # another device: summed
        kernel(COMPUTE, 90, 95),  # launch unknown
    ]
    streams = timeline.communication_streams(activities)
    windows = [(28, 60, "backward"), (0, 28, "forward"), (60, 90, "step")]
    found = timeline.busy_by_phase(activities, streams, windows)
    assert found == {"forward": (30, 30), "backward": (30, 10), "step": (0, 0), None: (0, 5)}


def test_figures_split_the_waited_time_by_phase():
    cpu = DeviceType.CPU
    mark = timeline.PHASE_MARK
    events = [
        _event(mark + "forward", 1, 0.0, 1600.0, cpu, "user_annotation"),
        _event(mark + "backward", 1, 1600.0, 5000.0, cpu, "user_annotation"),
        _event("cudaLaunchKernel", 1, 10.0, 12.0, cpu, "cuda_runtime", id=5),
        _event("gemm", COMPUTE, 20.0, 1000.0, id=5),
        _event(SLEEP, COMM, 1000.0, 3000.0, id=7),
        _event("cudaLaunchKernel", 1, 1500.0, 1502.0, cpu, "cuda_runtime", id=8),
        _event("gemm", COMPUTE, 3000.0, 4000.0, id=8),
    ]
    found = timeline.figures(events, steps=2)
    assert found["comm_waited_ms_per_step"] == 0.75  # [1500, 3000) us over 2 steps, launched in forward
    assert (found["comm_waited_forward_ms_per_step"], found["comm_waited_backward_ms_per_step"]) == (0.75, 0.0)
    assert (found["host_forward_ms_per_step"], found["host_backward_ms_per_step"]) == (0.8, 1.7)
    assert (found["compute_forward_ms_per_step"], found["compute_backward_ms_per_step"]) == (0.99, 0.0)
    assert found["comm_other_ms_per_step"] == 1.0  # launched before the profile


def test_report_shows_exposed_beside_modelled():
    from deepspeed_zeropp.simulate import report
    link = "100 Gbit/s"

    def block(modelled):
        figures = {"median_ms": 100.0, "median_cpu_ms": 90.0, "collectives": {"all_gather/bfloat16/inter": 4}}
        return {"by_link": {link: dict(figures, wire_mb={"inter": 8.0}, modelled_link_ms=modelled, problems=[])}}

    results = {
        "configs": ["unquantized", "ours-qwz"],
        "links": {
            link: "modelled"
        },
        "reps": [{
            "unquantized": block({"inter": 30.0}),
            "ours-qwz": block({
                "inter": 12.0,
                "intra": 0.5
            })
        }],
        "runs": {
            "unquantized": {},  # not profiled (CPU, --no-profile)
            "ours-qwz": {
                "kernel_launches_per_step": 10.0,
                "profiled_links": {
                    link: {
                        "exposed_comm_ms_per_step": 2.25,
                        "comm_waited_ms_per_step": 1.5,
                        "comm_ms_per_step": 12.0,
                        "comm_concurrent_ms_per_step": 0.0,
                        "modelled_link_ms_per_step": 12.5
                    }
                }
            }
        },
    }
    table, ratios = report.summary(results)
    assert table[link]["ours-qwz"]["exposed_comm_ms_per_step"] == 2.25
    assert table[link]["unquantized"]["exposed_comm_ms_per_step"] is None
    lines = report.markdown_table(table, ratios, link).splitlines()
    column = lines[0].split(" | ").index("comm waited / exposed / modelled ms")
    assert [line.split(" | ")[column] for line in lines[2:]] == ["- / - / 30.0", "1.5 / 2.2 / 12.5"]


def test_phase_bound_adds_each_phase_longer_of_its_work_and_its_link():
    from deepspeed_zeropp.simulate import report
    free = {
        "host_forward_ms_per_step": 100.0,
        "compute_forward_ms_per_step": 90.0,
        "host_backward_ms_per_step": 150.0,
        "compute_backward_ms_per_step": 200.0,
        "host_step_ms_per_step": 30.0,
        "compute_step_ms_per_step": 5.0
    }
    linked = {"comm_forward_ms_per_step": 600.0, "comm_backward_ms_per_step": 50.0, "comm_step_ms_per_step": 1.0}
    found = report.phase_bound(free, linked)
    assert found["bound"] == 600 + 200 + 30  # where max(free step 330, link 651) would say 651
    assert found["phases"]["backward"] == (200.0, 50.0)
    assert report.phase_bound(free, {"comm_ms_per_step": 651.0}) is None  # profiled before phases were marked
    assert report.phase_bound({}, linked) is None


def test_what_the_gpu_did_within_each_phase():
    """Clipped to each window, whoever launched the work: collectives, compute, idle, collectives alone."""
    activities = [
        kernel(COMPUTE, 0, 10),
        collective(COMM, 5, 40),  # crosses from forward into backward
        kernel(COMPUTE, 45, 50),
        collective(COMM, 60, 70),
    ]
    streams = timeline.communication_streams(activities)
    windows = [(0, 30, "forward"), (30, 80, "backward")]
    assert timeline.within_windows(activities, streams, windows) == {
        "forward": (25, 10, 0, 20),
        "backward": (20, 5, 25, 20),
    }
