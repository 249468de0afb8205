"""The search's ``measure``: simulated runs of a group of candidates (a configuration and its zero_optimization
sizes each), side by side.

Only one simulated world fits in a process, so every candidate of a search runs in this one; engines cost memory,
so a group's engines are built, measured and released before the next group's are built. Within a group each
engine is built and warmed once, then each repetition gives every engine in turn (the order rotated one further each
repetition) an untimed step and its timed steps under each link, as ``runner.run`` does for the plain comparison: a
ratio between two candidates of one group is taken within one repetition.
"""
import itertools
import time

from ..teardown import release
from . import runner
from .search import Result


def measurer(plan, progress=print):
    """``measure(candidates) -> {candidate: search.Result}`` over ``plan``'s links, repetitions and steps."""
    groups = itertools.count(1)

    def measure(candidates):
        group = next(groups)
        engines, infos, seconds, blocks = {}, {}, {}, {c: [] for c in candidates}
        try:
            for i, candidate in enumerate(candidates):
                progress(f"group {group}, building {i + 1}/{len(candidates)}: {candidate.describe()}")
                started = time.perf_counter()
                engines[candidate], infos[candidate] = runner._build_and_warm(
                    candidate.key, plan._replace(buckets=dict(candidate.settings)))
                seconds[candidate] = time.perf_counter() - started
            for rep in range(plan.reps):
                order = candidates[rep % len(candidates):] + candidates[:rep % len(candidates)]
                for i, candidate in enumerate(order):
                    progress(f"group {group}, repetition {rep + 1}/{plan.reps}, {i + 1}/{len(order)}: "
                             f"{candidate.describe()}")
                    started = time.perf_counter()
                    blocks[candidate].append(runner._block(candidate.key, engines[candidate], plan, infos[candidate]))
                    seconds[candidate] += time.perf_counter() - started
        finally:
            runner.set_patch(None)
            for engine in engines.values():
                release(engine)
        return {c: _result(blocks[c], seconds[c], group) for c in candidates}

    return measure


def _result(blocks, seconds, group):
    links = blocks[0]["by_link"]
    problems = []
    for i, block in enumerate(blocks):
        if block["skipped_steps"]:
            problems.append(f"repetition {i + 1}: {block['skipped_steps']} skipped step(s)")
        if not block["finite"]:
            problems.append(f"repetition {i + 1}: non-finite loss")
        for link, figures in block["by_link"].items():
            problems += [f"{link}: {p}" for p in figures["problems"]]
    peaks = [b["peak_memory_gb"] for b in blocks if b.get("peak_memory_gb") is not None]
    return Result(rep_ms={link: [b["by_link"][link]["median_ms"] for b in blocks]
                          for link in links},
                  peak_memory_gb=max(peaks) if peaks else None,
                  seconds=seconds,
                  problems=tuple(dict.fromkeys(problems)),
                  group=group)
