"""Figures from a simulated run's results (runner.run): per configuration and link the median step time with its
spread over repetitions, ratios taken within each repetition, and the checks every reported run must pass."""
import statistics

from .runner import CONFIGS, UPSTREAM_OF


def _spread(values):
    return {"median": statistics.median(values), "low": min(values), "high": max(values), "n": len(values)}


COMMUNICATION_FIGURES = ("exposed_comm_ms_per_step", "comm_waited_ms_per_step", "comm_ms_per_step",
                         "comm_concurrent_ms_per_step")


def summary(results):
    """{link: {config: figures}} and {link: {"A vs B": ratio spread}}; ratio = B's step time / A's (speed-up of A)."""
    table, ratios = {}, {}
    configs = results["configs"]
    for link in results["links"]:
        rows = table.setdefault(link, {})
        for key in configs:
            runs = [rep[key] for rep in results["reps"] if key in rep]
            per_link = [run["by_link"][link] for run in runs]
            first, once = runs[0], results.get("runs", {}).get(key, {})
            rows[key] = {
                "label": CONFIGS[key].label,
                "step_ms": _spread([r["median_ms"] for r in per_link]),
                "cpu_ms": _spread([r["median_cpu_ms"] for r in per_link]),
                "collectives_per_step": first["by_link"][link]["collectives"],
                "wire_mb_per_step": first["by_link"][link]["wire_mb"],
                "modelled_link_ms_per_step": first["by_link"][link]["modelled_link_ms"],
                "kernel_ms_per_step": once.get("kernel_ms_per_step"),
                "kernel_launches_per_step": once.get("kernel_launches_per_step"),
                "host_waits_per_step": once.get("host_waits_per_step"),
                # exposed, waited, total and concurrent communication of profiled steps under this link (timeline.py)
                **{
                    k: once.get("profiled_links", {}).get(link, {}).get(k)
                    for k in COMMUNICATION_FIGURES
                },
                "peak_memory_gb": max((r.get("peak_memory_gb") or 0 for r in runs), default=None) or None,
                "build_s": once.get("build_s"),
            }
        pairs = [(key, "unquantized") for key in configs if key != "unquantized"]
        pairs += [(ours, up) for ours, up in UPSTREAM_OF.items() if ours in configs and up in configs]
        for a, b in pairs:
            values = [
                rep[b]["by_link"][link]["median_ms"] / rep[a]["by_link"][link]["median_ms"] for rep in results["reps"]
                if a in rep and b in rep
            ]
            if values:
                spread = _spread(values)
                spread["beyond_noise"] = spread["low"] > 1 or spread["high"] < 1
                ratios.setdefault(link, {})[f"{a} vs {b}"] = spread
    return table, ratios


def phase_bound(free, linked, phases=("forward", "backward", "step")):
    """An estimate of the step's bound with ZeRO-3's order kept: each phase takes at least the longest of its
    collectives-free host time and GPU compute (``host_<phase>_ms_per_step``, ``compute_<phase>_...`` of the profile
    with no link) and the link time of the collectives launched in it (``comm_<phase>_ms_per_step`` under the
    link). A phase's collectives cannot start before it does (forward's all-gathers need the weights the previous
    step's optimizer wrote) and the next phase needs their results, so the phases' times add up, where
    max(collectives-free step, link time) lets all of the link hide behind any of the compute.
    ``{"phases": {phase: (free, link)}, "bound": ms}``, or None where a figure is missing (not profiled, or
    profiled before the phases were marked)."""
    try:
        found = {
            phase: (max(free[f"host_{phase}_ms_per_step"],
                        free[f"compute_{phase}_ms_per_step"]), linked[f"comm_{phase}_ms_per_step"])
            for phase in phases
        }
    except (KeyError, TypeError):
        return None
    return {"phases": found, "bound": sum(max(pair) for pair in found.values())}


def problems(results):
    """Every reason a run may not be reported: a skipped step, a non-finite loss, a quantized path that never ran."""
    found = []
    for i, rep in enumerate(results["reps"]):
        for key, run in rep.items():
            where = f"repetition {i + 1}, {CONFIGS[key].label}"
            if run.get("skipped_steps"):
                found.append(f"{where}: {run['skipped_steps']} skipped step(s)")
            if not run.get("finite", False):
                found.append(f"{where}: non-finite loss")
            for link, figures in run["by_link"].items():
                found += [f"{where}, {link}: {p}" for p in figures["problems"]]
    return found


BUSY_HOST_CORES = 0.5  # other processes' busy cores, on average over one link's timed steps, worth a note


def other_cores(results):
    """The most cores other processes kept busy on this machine during any link's timed steps, as the kernel counts
    them (runner's ``cores_busy``); None where it could not count the machine's."""
    found = [
        figures["cores_busy"]["machine"] - figures["cores_busy"]["this_process"] for rep in results["reps"]
        for run in rep.values() for figures in run["by_link"].values()
        if figures.get("cores_busy", {}).get("machine") is not None
    ]
    return max(found) if found else None


def recommend(table, link):
    """The fastest configuration under ``link`` that a user of this package runs (unquantized, or ours with every
    seam: upstream's and the variants that leave a seam out are there to compare with), and the DeepSpeed flags
    that select it."""
    rows = table[link]
    choices = [key for key in rows if _selectable(CONFIGS[key])] or list(rows)
    best = min(choices, key=lambda key: rows[key]["step_ms"]["median"])
    zero = dict(CONFIGS[best].zero)
    flags = {k: v for k, v in zero.items() if k != "hpz"}
    if zero.get("hpz"):
        flags["zero_hpz_partition_size"] = "GPUs per node"
    return best, flags


def _selectable(config):
    return not config.zero or (config.patched and not config.exclude and config.parts_in_place)


def markdown_table(table, ratios, link):
    lines = [
        "| configuration | step ms (median, low-high) | vs unquantized | vs upstream | host CPU ms | GPU kernel ms "
        "| launches | host waits | comm waited / exposed / modelled ms | collectives | MiB sent intra / inter | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    ]
    for key, row in table[link].items():
        step = row["step_ms"]
        vs_unq = ratios.get(link, {}).get(f"{key} vs unquantized")
        vs_up = ratios.get(link, {}).get(f"{key} vs {UPSTREAM_OF.get(key)}")
        wire = row["wire_mb_per_step"]

        def fmt(value, spec=".0f"):
            return "-" if value is None else format(value, spec)

        lines.append(
            f"| {row['label']} | {step['median']:.0f} ({step['low']:.0f}-{step['high']:.0f}) | "
            f"{_ratio(vs_unq)} | {_ratio(vs_up)} | {row['cpu_ms']['median']:.0f} | "
            f"{fmt(row['kernel_ms_per_step'])} | {fmt(row['kernel_launches_per_step'])} | "
            f"{fmt(row.get('host_waits_per_step'))} | {_exposed(row)} | "
            f"{sum(row['collectives_per_step'].values()):.0f} | "
            f"{wire.get('intra', 0):.0f} / {wire.get('inter', 0):.0f} | {fmt(row['peak_memory_gb'], '.1f')} |")
    return "\n".join(lines)


def _exposed(row):
    """Communication ms per step that launched compute waited on, and that no compute overlapped (profiled steps),
    over the link model's time (timed steps); - for a figure not measured (no profile, no CUDA, no launch times) or
    not modelled (a free link)."""
    waited, exposed = row.get("comm_waited_ms_per_step"), row.get("exposed_comm_ms_per_step")
    modelled = sum((row.get("modelled_link_ms_per_step") or {}).values())
    return " / ".join("-" if value is None else format(value, ".1f") for value in (waited, exposed, modelled or None))


def _ratio(spread):
    if not spread:
        return "-"
    mark = "" if spread["beyond_noise"] else " (noise)"
    return f"{spread['median']:.2f}x ({spread['low']:.2f}-{spread['high']:.2f}){mark}"
