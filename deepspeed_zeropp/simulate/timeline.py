"""The GPU timeline of a profiled stretch, and how much of its communication the compute leaves exposed.

A simulated collective runs on its process group's own stream (world.py): its copies, then ``link.Delay``'s sleep
kernel for the rest of its modelled time. Those streams are recognised by the sleep kernel (torch's
``spin_kernel``, which nothing else in a training step launches): every stream that ran one in the stretch is a
communication stream, and all of its activities (copies included) are the collectives'. Every other activity on the
device is compute: the training's stream and DeepSpeed's own side streams alike, since either keeps the GPU busy.

Exposed communication is the union of the collectives' intervals minus the union of the compute intervals, per
device, summed over devices: the time during which some collective runs while no compute does. That is not all on
the step's path: where the host is the bound, the GPU idles until the host launches the next work, and a collective
running meanwhile is hidden behind the host. Waited communication is the part of it during which the compute that
follows had already been launched: the compute was held back while the collective ran (a stream waiting on it),
which the step pays. It needs each activity's launch time (the CUDA runtime call that queued it); without them it is
None. Beside them, the communication time (the union of the collectives' intervals: its total on the timeline) and
the concurrent time (two or more communication streams busy at once, which the link model lets run at full speed
each). Where the host marked the phases of its steps (``record_function`` ranges named ``PHASE_MARK + phase``:
forward, backward, the optimizer step), the waited time is also split by the phase during which the host launched
the compute that waited: which part of the step pays for the link.

The figures come back in the unit the activities' times are given in; integers give exact results.
"""
import bisect
import collections
from typing import NamedTuple, Optional

SLEEP_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel: link.Delay launches it on group streams only
PHASE_MARK = "zeropp.simulate."  # host ranges named PHASE_MARK + one of PHASES (runner.step marks them)
PHASES = ("forward", "backward", "step")


class Activity(NamedTuple):
    """One kernel, copy or fill on the GPU timeline; ``launched``: when the host queued it (None: not known)."""
    device: int
    stream: int
    start: int
    duration: int
    name: str = ""
    launched: Optional[int] = None

    @property
    def end(self):
        return self.start + self.duration


class Exposure(NamedTuple):
    exposed: int  # collectives running, no compute running
    communication: int  # collectives running (any communication stream)
    concurrent: int  # two or more communication streams running at once
    waited: Optional[int] = None  # exposed, and the next compute already launched (None: launch times unknown)


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


def _within(union, ends, low, high):
    """How much of ``union`` (merged intervals, ``ends`` their ends) lies in [low, high)."""
    total = 0
    for start, end in union[bisect.bisect_right(ends, low):]:
        if start >= high:
            break
        total += min(end, high) - max(start, low)
    return total


def held_back(compute, collectives):
    """How long launched compute waited while a collective ran and no compute did, on one device: for each stretch
    without compute, from the launch of the compute that ends it (the earliest launched of those starting then) to
    its start, within the collectives' union. ``compute``: its activities. A stretch whose compute has no known
    launch (queued before the profile began) counts nothing; None where no launch time is known at all."""
    if compute and all(a.launched is None for a in compute):
        return None
    return sum(waited for _, waited in _waits(compute, collectives))


def _waits(compute, collectives):
    """(launch, waited) of each stretch without compute on one device whose ending compute has a known launch."""
    first_launch = {}
    for a in compute:
        if a.launched is not None:
            first_launch[a.start] = min(first_launch.get(a.start, a.launched), a.launched)
    union = merged(collectives)
    ends = [end for _, end in union]
    previous_end = None
    for start, end in merged((a.start, a.end) for a in compute):
        launched = first_launch.get(start)
        if launched is not None:
            since = launched if previous_end is None else max(previous_end, launched)
            yield launched, _within(union, ends, since, start)
        previous_end = end


def waited_by_phase(activities, comm_streams, windows):
    """{phase: waited time} of ``activities`` (as :func:`exposure`'s waited, per device, summed), each stretch's
    wait given to the phase whose host window (``(start, end, phase)``, disjoint) holds the launch of the compute
    that waited; a launch outside every window counts under None. Every phase of ``windows`` appears."""
    windows = sorted(windows)
    starts = [start for start, _, _ in windows]
    found = dict.fromkeys((phase for _, _, phase in windows), 0)
    for comm, compute in _per_device(activities, comm_streams):
        for launched, waited in _waits(compute, [interval for intervals in comm.values() for interval in intervals]):
            phase = _phase_of(windows, starts, launched)
            found[phase] = found.get(phase, 0) + waited
    return found


def _phase_of(windows, starts, time):
    """The phase of the window (sorted, disjoint ``(start, end, phase)``; ``starts`` their starts) holding ``time``,
    None where none does."""
    i = bisect.bisect_right(starts, time) - 1
    return windows[i][2] if i >= 0 and time < windows[i][1] else None


def busy_by_phase(activities, comm_streams, windows):
    """{phase: (communication, compute)}: per phase of ``windows`` (as :func:`waited_by_phase`'s), how long the GPU
    ran collectives, and compute, that the host launched in that phase (the union of their intervals per device,
    summed over devices); activities of unknown launch count under None. Every phase of ``windows`` appears. What a
    phase's link time is set against: forward's all-gathers can only hide behind forward's compute."""
    windows = sorted(windows)
    starts = [start for start, _, _ in windows]
    intervals = collections.defaultdict(list)  # (phase, device, is a collective) -> intervals
    for a in activities:
        phase = None if a.launched is None else _phase_of(windows, starts, a.launched)
        intervals[phase, a.device, (a.device, a.stream) in comm_streams].append((a.start, a.end))
    found = {phase: [0, 0] for _, _, phase in windows}
    for (phase, _, is_comm), spans in intervals.items():
        found.setdefault(phase, [0, 0])[0 if is_comm else 1] += length(spans)
    return {phase: tuple(totals) for phase, totals in found.items()}


def within_windows(activities, comm_streams, windows):
    """{phase: (communication, compute, idle, exposed)}: per host window (``(start, end, phase)``), what the GPU did
    during it, whoever launched it: the union of the collectives' intervals, of the compute's, the time neither ran,
    and the collectives' time with no compute beside it (per device, summed). Unlike :func:`busy_by_phase`, which
    gives work to the phase that launched it, this is the wall-clock picture of each phase: a phase whose idle time
    is large waited on the host, one whose exposed time is large on the link."""
    found = {}
    for start, end, phase in windows:

        def clip(intervals):
            return [(max(s, start), min(e, end)) for s, e in intervals if e > start and s < end]

        totals = [0, 0, 0, 0]
        for comm, compute in _per_device(activities, comm_streams):
            collectives = clip(interval for intervals in comm.values() for interval in intervals)
            work = clip((a.start, a.end) for a in compute)
            totals[0] += length(collectives)
            totals[1] += length(work)
            totals[2] += (end - start) - length(collectives + work)
            totals[3] += uncovered(collectives, work)
        previous = found.get(phase, (0, 0, 0, 0))
        found[phase] = tuple(p + t for p, t in zip(previous, totals))
    return found


def communication_streams(activities, marker=SLEEP_KERNEL):
    """The ``(device, stream)`` pairs that ran a kernel whose name contains ``marker``."""
    return {(a.device, a.stream) for a in activities if marker in a.name}


def _per_device(activities, comm_streams):
    """Per device: its collectives' intervals by stream (those on ``comm_streams``) and its compute activities."""
    by_device = collections.defaultdict(lambda: (collections.defaultdict(list), []))
    for a in activities:
        comm, compute = by_device[a.device]
        if (a.device, a.stream) in comm_streams:
            comm[a.stream].append((a.start, a.end))
        else:
            compute.append(a)
    return by_device.values()


def exposure(activities, comm_streams):
    """:class:`Exposure` of ``activities``, with those on ``comm_streams`` (``(device, stream)`` pairs) the
    collectives' and every other one compute; per device, summed over devices."""
    exposed = communication = concurrent = waited = 0
    for comm, compute in _per_device(activities, comm_streams):
        collectives = [interval for intervals in comm.values() for interval in intervals]
        exposed += uncovered(collectives, [(a.start, a.end) for a in compute])
        communication += length(collectives)
        concurrent += overlapped(comm.values())
        held = held_back(compute, collectives)
        waited = None if waited is None or held is None else waited + held
    return Exposure(exposed, communication, concurrent, waited)


WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the profiler's activity types of GPU work (not its markers)


def _ns(us):
    return round(us * 1000)


def from_profile(events):
    """The device activities of torch.profiler's events (``profile.events()``), times in integer nanoseconds: every
    kernel, copy and fill (a simulated collective's copies are part of it), never a marker the profiler puts on the
    device's timeline (a stream's wait, a ``record_function`` range: :func:`is_work`). An activity's launch: the
    start of the CUDA runtime call with its correlation id (the event's ``id``; a runtime call is a host event named
    ``cuda...`` or ``cu...``)."""
    from torch.autograd import DeviceType
    launches = {
        e.id: _ns(e.time_range.start)
        for e in events if e.device_type == DeviceType.CPU and e.name.startswith("cu") and getattr(e, "id", None)
    }
    found = []
    for e in events:
        if e.device_type == DeviceType.CUDA and is_work(e):
            stream = getattr(e, "device_resource_id", None)
            start, end = _ns(e.time_range.start), _ns(e.time_range.end)
            found.append(
                Activity(e.device_index, e.thread if stream is None else stream, start, end - start, e.name,
                         launches.get(getattr(e, "id", None))))
    return found


def is_work(event):
    """Whether a device event is GPU work, not a marker. The profiler mirrors every ``record_function`` range
    onto the streams it launched work on, spanning that work; torch 2.11's events carry no activity type for these
    mirrors, so a marker is also known by its flag or, for the phases' ranges, its name. Counted as compute, the
    forward's range alone would cover the whole forward and hide every collective in it."""
    kind = getattr(event, "activity_type", None)
    if kind is not None:
        return kind.lower() in WORK
    return not getattr(event, "is_user_annotation", False) and not event.name.startswith(PHASE_MARK)


FIGURES = (("exposed_comm", "exposed"), ("comm_waited", "waited"), ("comm", "communication"),
           ("comm_concurrent", "concurrent"))  # (name in the results, Exposure field)


def phase_windows(events):
    """The host's phase ranges in ``events`` (CPU ranges named PHASE_MARK + phase) as ``(start, end, phase)`` in
    integer nanoseconds."""
    from torch.autograd import DeviceType
    return [(_ns(e.time_range.start), _ns(e.time_range.end), e.name[len(PHASE_MARK):]) for e in events
            if e.device_type == DeviceType.CPU and e.name.startswith(PHASE_MARK)]


def figures(events, steps):
    """Exposed, waited, total and concurrent communication ms per step of a profile of ``steps`` steps; each None
    where the profile ran no communication stream (no link model: collectives then cost only their copies), waited
    also where launch times are unknown. Where the host marked its phases, also the waited ms per step by phase
    (``comm_waited_<phase>_ms_per_step``; ``..._other_...``: compute launched outside them), the GPU's busy time
    by the phase that launched it (``comm_<phase>_...``, ``compute_<phase>_...``: :func:`busy_by_phase`), what the
    GPU did during each phase's host window (``exposed_comm_in_<phase>_...``, ``idle_in_<phase>_...``:
    :func:`within_windows`), and each phase's host time (``host_<phase>_ms_per_step``)."""
    activities = from_profile(events)
    streams = communication_streams(activities)
    found = exposure(activities, streams) if streams else None
    values = {field: None if found is None else getattr(found, field) for _, field in FIGURES}
    result = {
        f"{name}_ms_per_step": None if values[field] is None else values[field] / 1e6 / steps
        for name, field in FIGURES
    }
    windows = phase_windows(events)
    if windows and values["waited"] is not None:
        for phase, waited in waited_by_phase(activities, streams, windows).items():
            result[f"comm_waited_{phase or 'other'}_ms_per_step"] = waited / 1e6 / steps
    if windows:
        for phase, busy in busy_by_phase(activities, streams, windows).items():
            for name, value in zip(("comm", "compute"), busy):
                result[f"{name}_{phase or 'other'}_ms_per_step"] = value / 1e6 / steps
    if windows and streams:
        for phase, (_, _, idle, exposed) in within_windows(activities, streams, windows).items():
            result[f"exposed_comm_in_{phase}_ms_per_step"] = exposed / 1e6 / steps
            result[f"idle_in_{phase}_ms_per_step"] = idle / 1e6 / steps
    for start, end, phase in windows:
        key = f"host_{phase}_ms_per_step"
        result[key] = result.get(key, 0) + (end - start) / 1e6 / steps
    return result
