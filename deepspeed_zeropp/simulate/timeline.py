"""The GPU timeline of a profiled stretch, and how much of its communication the compute leaves exposed.

A simulated collective runs on its process group's own stream (world.py): its copies, then ``link.Delay``'s sleep
kernel for the rest of its modelled time. Those streams are recognised by the sleep kernel (torch's
``spin_kernel``, which nothing else in a training step launches): every stream that ran one in the stretch is a
communication stream, and all of its activities (copies included) are the collectives'. Every other activity on the
device is compute: the training's stream and DeepSpeed's own side streams alike, since either keeps the GPU busy.

Exposed communication is the union of the collectives' intervals minus the union of the compute intervals, per
device, summed over devices: the time during which some collective runs while no compute does, which the step
cannot hide (the compute stream waits on the collective). Beside it, the communication time (the union of the
collectives' intervals: its total on the timeline) and the concurrent time (two or more communication streams busy at
once, which the link model lets run at full speed each).

The figures come back in the unit the activities' times are given in; integers give exact results.
"""
import collections
from typing import NamedTuple

SLEEP_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel: link.Delay launches it on group streams only


class Activity(NamedTuple):
    """One kernel, copy or fill on the GPU timeline."""
    device: int
    stream: int
    start: int
    duration: int
    name: str = ""

    @property
    def end(self):
        return self.start + self.duration


class Exposure(NamedTuple):
    exposed: int  # collectives running, no compute running
    communication: int  # collectives running (any communication stream)
    concurrent: int  # two or more communication streams running at once


def merged(intervals):
    """The union of ``(start, end)`` intervals as sorted, disjoint ones (empty ones dropped; touching ones joined)."""
    union = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def length(intervals):
    """The length of the union of ``intervals``."""
    return sum(end - start for start, end in merged(intervals))


def uncovered(intervals, cover):
    """The length of the union of ``intervals`` minus the union of ``cover``: |A \\ B| = |A u B| - |B|."""
    cover = list(cover)
    return length(list(intervals) + cover) - length(cover)


def overlapped(per_stream, at_least=2):
    """How long ``at_least`` of the interval lists in ``per_stream`` (each list merged on its own first) run at once."""
    edges = collections.Counter()
    for intervals in per_stream:
        for start, end in merged(intervals):
            edges[start] += 1
            edges[end] -= 1
    total, running, since = 0, 0, None
    for time in sorted(edges):
        if running >= at_least:
            total += time - since
        running += edges[time]
        since = time
    return total


def communication_streams(activities, marker=SLEEP_KERNEL):
    """The ``(device, stream)`` pairs that ran a kernel whose name contains ``marker``."""
    return {(a.device, a.stream) for a in activities if marker in a.name}


def exposure(activities, comm_streams):
    """:class:`Exposure` of ``activities``, with those on ``comm_streams`` (``(device, stream)`` pairs) the
    collectives' and every other one compute; per device, summed over devices."""
    by_device = collections.defaultdict(lambda: (collections.defaultdict(list), []))
    for a in activities:
        comm, compute = by_device[a.device]
        if (a.device, a.stream) in comm_streams:
            comm[a.stream].append((a.start, a.end))
        else:
            compute.append((a.start, a.end))
    exposed = communication = concurrent = 0
    for comm, compute in by_device.values():
        collectives = [interval for intervals in comm.values() for interval in intervals]
        exposed += uncovered(collectives, compute)
        communication += length(collectives)
        concurrent += overlapped(comm.values())
    return Exposure(exposed, communication, concurrent)


WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the profiler's activity types of GPU work (not its markers)


def from_profile(events):
    """The device activities of torch.profiler's events (``profile.events()``), times in integer nanoseconds: every
    kernel, copy and fill (a simulated collective's copies are part of it), never a marker the profiler puts on the
    device's timeline (a stream's wait, a ``record_function`` range); a profiler that names no activity types gives
    every device event."""
    from torch.autograd import DeviceType
    found = []
    for e in events:
        kind = getattr(e, "activity_type", None)
        if e.device_type != DeviceType.CUDA or (kind is not None and kind.lower() not in WORK):
            continue
        stream = getattr(e, "device_resource_id", None)
        start, end = round(e.time_range.start * 1000), round(e.time_range.end * 1000)
        found.append(Activity(e.device_index, e.thread if stream is None else stream, start, end - start, e.name))
    return found


def figures(events, steps):
    """Exposed, total and concurrent communication ms per step of a profile of ``steps`` steps; each None where
    the profile ran no communication stream (no link model: collectives then cost only their copies)."""
    activities = from_profile(events)
    streams = communication_streams(activities)
    found = exposure(activities, streams) if streams else None
    return {
        f"{name}_ms_per_step": None if found is None else getattr(found, field) / 1e6 / steps
        for name, field in (("exposed_comm", "exposed"), ("comm", "communication"), ("comm_concurrent", "concurrent"))
    }
