"""Which ``zero_optimization`` block is fastest: a coordinate descent over the sizes that move a ZeRO-3 step, for each
ZeRO++ configuration and for unquantized ZeRO-3 alike, and the block to paste.

Fixed bucket sizes decide too much to compare configurations at one setting: a 7B at 64 ranks gained from prefetch
buckets of 2e8-6e8 under ZeRO++ and not unquantized, a 1.4B on 2 x 8 at 100 Gbit/s from a 5e7 prefetch bucket
instead of the HF Trainer's 0.9 * width^2. So each configuration gets its own settings, and unquantized ZeRO-3 with
tuned settings is a baseline beside the user's own.

The search is a pure function of ``measure(candidates) -> {candidate: result}``: the simulated runs
(``trials.measurer``) or a test's table. One call is one group of runs measured side by side (interleaved), so a
decision (which value of one knob, for one configuration) is always taken within one group. The grid is data
(:data:`GRID`); ``--grid`` on the command line replaces it.
"""
import json
import statistics
from typing import NamedTuple, Optional

from . import config as configs
from .runner import CONFIGS


class Knob(NamedTuple):
    key: str  # a zero_optimization key
    values: tuple  # numbers, or "auto" (the HF Trainer's value for the model's width); () for hpZ: see values()
    hpz_only: bool = False  # searched only for configurations that run hpZ


GRID = (
    Knob("stage3_prefetch_bucket_size", ("auto", 5e7, 2e8, 6e8)),
    Knob("reduce_bucket_size", ("auto", 5e8)),
    Knob("stage3_max_live_parameters", (1e9, 3e9)),  # 1e9: DeepSpeed's default
    Knob(configs.HPZ, (), hpz_only=True),  # the divisors > 1 of GPUs per node
)
KNOBS = {knob.key: knob for knob in GRID}


def values(knob, width, gpus_per_node):
    """The whole numbers ``knob`` takes for a model of ``width`` on nodes of ``gpus_per_node`` GPUs."""
    if knob.key == configs.HPZ and not knob.values:
        return tuple(d for d in range(2, gpus_per_node + 1) if gpus_per_node % d == 0)
    auto = configs.hf_auto(width)
    resolved = (auto[knob.key] if v == "auto" else int(v) for v in knob.values)
    return tuple(dict.fromkeys(resolved))  # in order, once each


def is_hpz(key):
    return bool(CONFIGS[key].zero.get("hpz"))


class Candidate(NamedTuple):
    """One run: a configuration of runner.CONFIGS and its zero_optimization sizes, as sorted (key, value) pairs."""
    key: str
    settings: tuple

    @classmethod
    def of(cls, key, settings):
        return cls(key, tuple(sorted(settings.items())))

    def with_value(self, name, value):
        return Candidate.of(self.key, dict(self.settings, **{name: value}))

    def sizes(self):
        return ", ".join(f"{SHORT.get(k, k)} {_number(v)}" for k, v in self.settings) or "DeepSpeed's defaults"

    def describe(self):
        return f"{CONFIGS[self.key].label} ({self.sizes()})"


SHORT = {  # names in progress lines and tables (the block printed spells each key out)
    "stage3_prefetch_bucket_size": "prefetch",
    "reduce_bucket_size": "reduce",
    "stage3_param_persistence_threshold": "persistence",
    "stage3_max_live_parameters": "max live",
    "stage3_max_reuse_distance": "reuse distance",
    configs.HPZ: "hpZ",
}


def _number(value):
    """5e7 rather than 50000000; small numbers as they are."""
    if value < 10**4:
        return str(value)
    exponent = len(str(int(value))) - 1
    return f"{value / 10**exponent:.3g}e{exponent}"


class Result(NamedTuple):
    """What ``measure`` tells of one candidate: per link the median step ms of each repetition, the peak memory
    (None where unmeasured, e.g. on CPU), the seconds the candidate cost (build and steps), why it cannot be
    reported (empty when it can), and which ``measure`` call measured it (ratios within one are interleaved)."""
    rep_ms: dict
    peak_memory_gb: Optional[float]
    seconds: float
    problems: tuple = ()
    group: int = 0

    def ms(self, link):
        return statistics.median(self.rep_ms[link])


class Answer(NamedTuple):
    """The search's outcome for one link."""
    link: str
    best: Candidate
    baseline: Candidate  # unquantized with the user's sizes
    tuned_unquantized: Candidate
    finalists: tuple  # every configuration's best, the baselines first
    results: dict  # Candidate -> Result (the measurement the answer is read from)
    interleaved: bool  # finalists measured side by side (else from the groups that explored them)


class Outcome(NamedTuple):
    answers: tuple  # an Answer per link
    unexplored: tuple  # "knob for configuration" strings the budget left out
    rejected: tuple  # "candidate: why" for runs excluded (memory, problems)
    runs: int
    seconds: float


def search(keys, start, grid, links, measure, budget_s=None, memory_gb=None, progress=lambda message: None):
    """Coordinate descent: from ``start`` (the user's sizes), for each knob in turn and each configuration of
    ``keys`` ("unquantized" among them), measure every value of the knob with the others at the best so far and keep
    the fastest that fits ``memory_gb`` and ran cleanly; per link of ``links`` separately, in one set of runs.

    ``grid``: (knob key, whole numbers, hpZ only) tuples. ``budget_s`` bounds the seconds the measurements report:
    before each group its cost is estimated from the seconds a run has cost so far, and exploring stops where that
    group and the final comparison would not fit. The finalists (baselines, each configuration's best) are then
    measured side by side, when that fits too."""
    keys = ["unquantized"] + [k for k in keys if k != "unquantized"]
    state = {"runs": 0, "seconds": 0.0, "group": 0}
    latest, rejected = {}, {}

    def run(group):
        results = measure(list(group))
        state["runs"] += len(group)
        state["seconds"] += sum(r.seconds for r in results.values())
        latest.update(results)
        for candidate, result in results.items():
            why = _why_not(result, memory_gb)
            if why:
                rejected[candidate] = why
        return results

    def per_run():
        return state["seconds"] / max(state["runs"], 1)

    baseline = Candidate.of("unquantized", start)
    first = [Candidate.of(k, start) for k in keys]
    progress(f"search: {len(first)} runs at your sizes first, then up to "
             f"{_planned(keys, grid, links)} runs over {len(grid)} knob(s), then the finalists side by side")
    run(first)
    best = {(link, k): Candidate.of(k, start) for link in links for k in keys}
    steps = [(name, numbers, k) for name, numbers, hpz_only in grid for k in keys if is_hpz(k) or not hpz_only]
    progress(f"search: {per_run():.0f} s a run so far; about {_planned(keys, grid, links) * per_run() / 60:.1f} min "
             f"to explore every knob" + (f", within a budget of {budget_s / 60:.1f} min" if budget_s else ""))
    unexplored = []
    for i, (name, numbers, key) in enumerate(steps):
        group = list(dict.fromkeys(best[(link, key)].with_value(name, v) for link in links for v in numbers))
        finals = len(_finalists(best, baseline, links, keys))
        if budget_s is not None and state["seconds"] + (len(group) + finals) * per_run() > budget_s:
            unexplored = [f"{n} for {CONFIGS[k].label}" for n, _, k in steps[i:]]
            progress(f"search: budget reached after {state['seconds'] / 60:.1f} min; left unexplored: " +
                     "; ".join(unexplored))
            break
        progress(f"search {i + 1}/{len(steps)}: {name} for {CONFIGS[key].label}, {len(group)} runs "
                 f"(about {len(group) * per_run() / 60:.1f} min)")
        results = run(group)
        for link in links:
            fine = [c for c in group if c not in rejected]
            if fine:
                best[(link, key)] = min(fine, key=lambda c: results[c].ms(link))
    finalists = _finalists(best, baseline, links, keys)
    interleaved = budget_s is None or state["seconds"] + len(finalists) * per_run() <= budget_s
    if interleaved:
        progress(f"search: the {len(finalists)} finalists side by side")
        final = run(finalists)
    else:
        progress("search: no budget left to measure the finalists side by side; figures from the groups that "
                 "explored them")
        final = {c: latest[c] for c in finalists}
    answers = []
    for link in links:
        mine = [baseline, best[(link, "unquantized")]] + [best[(link, k)] for k in keys[1:]]
        fine = [c for c in dict.fromkeys(mine) if c not in rejected] or [baseline]
        fastest = sorted(fine, key=lambda c: final[c].ms(link))
        # tuned unquantized: the faster of the user's sizes and the search's, side by side
        tuned = next((c for c in fastest if c.key == "unquantized"), best[(link, "unquantized")])
        answers.append(Answer(link, fastest[0], baseline, tuned, tuple(dict.fromkeys(mine)), final, interleaved))
    return Outcome(tuple(answers), tuple(unexplored), tuple(f"{c.describe()}: {why}" for c, why in rejected.items()),
                   state["runs"], state["seconds"])


def _planned(keys, grid, links):
    """Runs the knobs take at most (links that keep the same best share runs, so often fewer)."""
    return sum(len(numbers) * len(links) for _, numbers, hpz_only in grid for k in keys if is_hpz(k) or not hpz_only)


def _finalists(best, baseline, links, keys):
    return list(dict.fromkeys([baseline] + [best[(link, k)] for link in links for k in keys]))


def _why_not(result, memory_gb):
    if result.problems:
        return "not valid: " + "; ".join(result.problems)
    if memory_gb is not None and result.peak_memory_gb is not None and result.peak_memory_gb > memory_gb:
        return f"peak {result.peak_memory_gb:.1f} GiB does not fit {memory_gb:g} GiB"
    return ""


def ratio(answer, slower, faster):
    """``slower``'s step time over ``faster``'s under the answer's link: (median, low, high) over repetitions when
    both ran side by side, else the ratio of their medians three times."""
    a, b = answer.results[slower], answer.results[faster]
    if answer.interleaved and a.group == b.group and len(a.rep_ms[answer.link]) == len(b.rep_ms[answer.link]):
        values = [x / y for x, y in zip(a.rep_ms[answer.link], b.rep_ms[answer.link])]
        return statistics.median(values), min(values), max(values)
    value = a.ms(answer.link) / b.ms(answer.link)
    return value, value, value


def block(candidate, gpus_per_node, user=None):
    """The ``zero_optimization`` block that runs ``candidate``: stage 3, its ZeRO++ flags, the sizes measured, and
    the user's keys the simulation does not model (kept as they were)."""
    zero = dict(user.other) if user else {}
    zero["stage"] = 3
    zero.update({k: v for k, v in CONFIGS[candidate.key].zero.items() if k != "hpz"})
    if is_hpz(candidate.key):
        zero[configs.HPZ] = gpus_per_node
    zero.update(candidate.settings)
    if not is_hpz(candidate.key):
        zero.pop(configs.HPZ, None)
    return {"zero_optimization": zero}


def render(outcome, gpus_per_node, memory_gb=None, user=None):
    """What the command prints: per link the block to paste, its speed-ups against unquantized ZeRO-3 with the
    user's sizes and with tuned sizes, and the memory of each."""
    yours = f"your config's sizes ({user.path})" if user else "the HF Trainer's \"auto\" sizes"
    lines = []
    for answer in outcome.answers:
        results, link = answer.results, answer.link

        def memory(candidate):
            peak = results[candidate].peak_memory_gb
            return "peak memory not measured (CPU)" if peak is None else f"peak {peak:.1f} GiB"

        lines += [
            f"\n{link}: every configuration at its best sizes" +
            ("" if answer.interleaved else " (not measured side by side)"), ""
        ]
        lines += [
            "| configuration | sizes | step ms | vs unquantized, your sizes | peak GiB |", "|---|---|---|---|---|"
        ]
        for candidate in answer.finalists:
            r = results[candidate]
            vs = ratio(answer, answer.baseline, candidate)
            note = " (yours)" if candidate == answer.baseline else ""
            peak = "-" if r.peak_memory_gb is None else f"{r.peak_memory_gb:.1f}"
            lines.append(f"| {CONFIGS[candidate.key].label}{note} | {candidate.sizes()} | {r.ms(link):.0f} | "
                         f"{vs[0]:.2f}x ({vs[1]:.2f}-{vs[2]:.2f}) | {peak} |")
        best = answer.best
        mine, tuned = ratio(answer, answer.baseline, best), ratio(answer, answer.tuned_unquantized, best)
        lines += [
            "", f"best: {best.describe()}, {memory(best)}" +
            (f" of {memory_gb:g} GiB" if memory_gb and results[best].peak_memory_gb is not None else ""),
            f"  {mine[0]:.2f}x ({mine[1]:.2f}-{mine[2]:.2f}) against unquantized ZeRO-3 with {yours}: "
            f"{results[answer.baseline].ms(link):.0f} ms, {memory(answer.baseline)}",
            f"  {tuned[0]:.2f}x ({tuned[1]:.2f}-{tuned[2]:.2f}) against unquantized ZeRO-3 with tuned sizes "
            f"({answer.tuned_unquantized.sizes()}): {results[answer.tuned_unquantized].ms(link):.0f} ms, "
            f"{memory(answer.tuned_unquantized)}"
        ]
        if best.key == "unquantized":
            lines.append("  unquantized ZeRO-3 is the fastest here: leave the ZeRO++ flags off")
        lines += ["", json.dumps(block(best, gpus_per_node, user), indent=2)]
    if user and user.other:
        lines.append(f"\nkept from your zero_optimization as they are (not simulated): {', '.join(user.other)}")
    if outcome.unexplored:
        lines.append("\nleft unexplored (budget): " + "; ".join(outcome.unexplored))
    if outcome.rejected:
        lines += ["\nexcluded:"] + [f"  {why}" for why in outcome.rejected]
    lines.append(f"\n[simulate] search: {outcome.runs} runs, {outcome.seconds / 60:.1f} min measured")
    return "\n".join(lines)


def to_json(outcome):
    """The outcome as JSON-ready data (for ``--json``)."""

    def figures(candidate, result):
        return {
            "config": candidate.key,
            "settings": dict(candidate.settings),
            "step_ms": {
                link: statistics.median(ms)
                for link, ms in result.rep_ms.items()
            },
            "rep_ms": result.rep_ms,
            "peak_memory_gb": result.peak_memory_gb,
            "seconds": result.seconds,
            "problems": list(result.problems),
        }

    return {
        "answers": [{
            "link": a.link,
            "best": figures(a.best, a.results[a.best]),
            "baseline": figures(a.baseline, a.results[a.baseline]),
            "tuned_unquantized": figures(a.tuned_unquantized, a.results[a.tuned_unquantized]),
            "finalists": [figures(c, a.results[c]) for c in a.finalists],
            "interleaved": a.interleaved,
        } for a in outcome.answers],
        "unexplored":
        list(outcome.unexplored),
        "rejected":
        list(outcome.rejected),
        "runs":
        outcome.runs,
        "seconds":
        outcome.seconds,
    }
