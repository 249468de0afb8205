"""Stand-ins for an accelerator's streams and events that log what is asked of them, for the tests of the
gradient buckets' two reduce streams (patching/seams/buckets.py): on the CPU, where DeepSpeed has no stream, they
show which stream waits on which, and where each event was recorded."""


class Stream:

    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_event(self, event):
        self.log.append(f"{self.name} waits {event.name}")

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


class Accelerator:
    """What the seam asks of DeepSpeed's accelerator. ``current()``: the stream an event is recorded on."""

    def __init__(self, log, current, ordered=False):
        self.log, self.current, self.ordered, self.events = log, current, ordered, 0
        self.default = Stream("default", log)

    def Stream(self):  # noqa: N802 (DeepSpeed's accelerator API)
        return Stream("spare", self.log)

    def Event(self):  # noqa: N802
        self.events += 1
        return _Event(f"read{self.events}", self)

    def default_stream(self):
        return self.default

    def resolves_data_dependency(self):
        return self.ordered


class _Event:

    def __init__(self, name, accelerator):
        self.name, self.accelerator = name, accelerator

    def record(self):
        self.accelerator.log.append(f"{self.name} on {self.accelerator.current().name}")
