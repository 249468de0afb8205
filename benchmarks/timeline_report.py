"""What the GPU did in each phase of one profiled step, from the timelines ``backpressure.py --dump`` writes.

Per file (one configuration's step under the modelled link) and per phase of the host (forward, backward, the
optimizer step with the loss's wait): the host window, and within it the union of the collectives' intervals, of
the compute's, the time the GPU ran nothing, and the collectives' time with no compute beside it
(``timeline.within_windows``); then the same step's collectives and compute by the phase that launched them
(``timeline.busy_by_phase``). A phase with large idle time waited on the host; one with large exposed time, on the
link. Pure arithmetic on the saved activities: runs anywhere.

    python benchmarks/timeline_report.py benchmarks/results/timeline_*.json.gz [--out FILE.md]
"""
import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deepspeed_zeropp.simulate import timeline  # noqa: E402


def load(path):
    with gzip.open(path, "rt") as f:
        saved = json.load(f)
    # dumps saved before timeline.is_work hold the phases' ranges the profiler mirrors on the device: no work
    activities = [timeline.Activity(*a) for a in saved["activities"] if not a[4].startswith(timeline.PHASE_MARK)]
    return activities, {tuple(s) for s in saved["comm_streams"]}, sorted(tuple(w) for w in saved["windows"])


def table(path):
    activities, streams, windows = load(path)
    within = timeline.within_windows(activities, streams, windows)
    launched = timeline.busy_by_phase(activities, streams, windows)
    hosts = {phase: (end - start) for start, end, phase in windows}
    ms = lambda ns: f"{ns / 1e6:.0f}"  # noqa: E731
    lines = [
        f"**{Path(path).name}**", "", "| phase | host window | collectives | compute | GPU idle | collectives "
        "alone (exposed) | collectives / compute launched in it |", "|---|---|---|---|---|---|---|"
    ]
    for phase in hosts:
        comm, compute, idle, exposed = within[phase]
        lines.append(f"| {phase} | {ms(hosts[phase])} | {ms(comm)} | {ms(compute)} | {ms(idle)} | {ms(exposed)} | "
                     f"{ms(launched[phase][0])} / {ms(launched[phase][1])} |")
    total = timeline.exposure(activities, streams)
    lines += [
        "", f"Whole step: {ms(sum(hosts.values()))} ms of host windows; collectives {ms(total.communication)} ms, "
        f"exposed {ms(total.exposed)}, waited {ms(total.waited or 0)}, two or more communication streams at once "
        f"{ms(total.concurrent)}.", ""
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = "\n".join(table(path) for path in args.files)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
