"""ZeRO++ at 2 to 64 ranks, measured on one GPU: the settings of the simulated-world benchmark, run through
``python -m deepspeed_zeropp simulate`` (one process per setting: a process holds one simulated world), and their
results rendered as one table file with its plot, and the comparison of the link model with the 2-GPU runs.

    source benchmarks/gpu_env.sh
    python3 benchmarks/simulated_world.py run n8_free n16_free n64_7b_100g n64_7b_400g n2_validation
    python3 benchmarks/simulated_world.py render   # simulated_world.{md,png}

Each setting writes ``simulated_NAME.json`` (every figure, the commit measured) into --out after every repetition.
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from deepspeed_zeropp.simulate import report  # noqa: E402
from deepspeed_zeropp.simulate.runner import CONFIGS  # noqa: E402
from benchmarks.common import commit  # noqa: E402

SETTINGS = {  # name -> (what it shows, the simulate command's arguments)
    "n8_free": ("1.4B GPT, one node of 8, collectives free (what each path costs the host and the GPU) and over "
                "modelled NVLink",
                "--model gpt-1.4b --gpus-per-node 8 --nodes 1 --free --inter-gbps 100 --configs unquantized ours-qwz "
                "ours-qwz-two-gathers upstream-qwz --reps 8 --steps 3 --warmup 2"),
    "n16_free": ("1.4B GPT, 2 nodes of 8, collectives free",
                 "--model gpt-1.4b --gpus-per-node 8 --nodes 2 --free --inter-gbps --configs unquantized ours-qwz-qgz "
                 "upstream-qwz-qgz --reps 3 --steps 10 --warmup 1"),
    "n8_auto": ("1.4B GPT, one node of 8, collectives free, the HF Trainer's \"auto\" bucket sizes (many small "
                "fetches: what a quantized fetch costs the host)",
                "--model gpt-1.4b --gpus-per-node 8 --nodes 1 --free --configs unquantized ours-qwz upstream-qwz "
                "--reps 6 --steps 3 --warmup 2"),
    "n16_100g_auto": ("1.4B GPT, 2 nodes of 8, 100 Gbit/s per node between nodes (12.5 per GPU), \"auto\" bucket "
                      "sizes", "--model gpt-1.4b --gpus-per-node 8 --nodes 2 --inter-gbps 12.5 --configs unquantized "
                      "ours-qwz-qgz upstream-qwz-qgz --reps 3 --steps 4 --warmup 1"),
    "n16_100g_tuned": ("1.4B GPT, 2 nodes of 8, 100 Gbit/s per node between nodes (12.5 per GPU), every "
                       "configuration at the sizes `simulate --search` found best for ours qwZ+qgZ "
                       "(`benchmarks/configs/gpt1.4b_2x8_tuned.json`)",
                       "--model gpt-1.4b --gpus-per-node 8 --nodes 2 --inter-gbps 12.5 --deepspeed-config "
                       "benchmarks/configs/gpt1.4b_2x8_tuned.json --configs unquantized ours-qwz-qgz upstream-qwz-qgz "
                       "--reps 3 --steps 4 --warmup 1"),
    # one process per link: three repetitions of both links do not fit one 10-minute GPU call
    "n64_7b_100g": ("7B GPT, 8 nodes of 8, NVLink inside a node, 100 Gbit/s per node between nodes (12.5 per GPU)",
                    "--model gpt-7b --gpus-per-node 8 --nodes 8 --inter-gbps 12.5 --configs unquantized ours-qwz-qgz "
                    "upstream-qwz-qgz ours-qwz-qgz-hpz upstream-qwz-qgz-hpz --reps 3 --steps 10 --warmup 1 "
                    "--no-profile"),
    "n64_7b_400g": ("7B GPT, 8 nodes of 8, NVLink inside a node, 400 Gbit/s per node between nodes (50 per GPU)",
                    "--model gpt-7b --gpus-per-node 8 --nodes 8 --inter-gbps 50 --configs unquantized ours-qwz-qgz "
                    "upstream-qwz-qgz ours-qwz-qgz-hpz upstream-qwz-qgz-hpz --reps 3 --steps 10 --warmup 1 "
                    "--no-profile"),
    # ~3.5 minutes of timed repetitions; its profiled steps are the next setting's (both in one 10-minute GPU call
    # do not fit)
    "n64_7b_tuned": ("7B GPT, 8 nodes of 8, 100 and 400 Gbit/s per node between nodes (12.5 and 50 per "
                     "GPU), every configuration at the sizes `simulate --search` found best for ours qwZ+qgZ "
                     "(`benchmarks/configs/gpt7b_tuned.json`)",
                     "--model gpt-7b --gpus-per-node 8 --nodes 8 --inter-gbps 12.5 50 --deepspeed-config "
                     "benchmarks/configs/gpt7b_tuned.json --configs unquantized ours-qwz-qgz upstream-qwz-qgz "
                     "ours-qwz-qgz-hpz upstream-qwz-qgz-hpz ours-qwz-qgz-hpz-step-writes --reps 3 --steps 3 "
                     "--warmup 1 --no-profile"),
    # the profiled steps of the row above (exposed and waited communication per configuration), in one GPU call
    "n64_7b_tuned_profile": ("7B GPT, 8 nodes of 8, as `n64_7b_tuned`, one repetition: its profiled steps",
                             "--model gpt-7b --gpus-per-node 8 --nodes 8 --inter-gbps 12.5 50 --deepspeed-config "
                             "benchmarks/configs/gpt7b_tuned.json --configs unquantized ours-qwz-qgz ours-qwz-qgz-hpz "
                             "--reps 1 --steps 2 --warmup 1"),
    # the bound's other half: the same sizes with collectives free (what the host and the GPU's compute take)
    "n64_7b_tuned_free": ("7B GPT, 8 nodes of 8, as `n64_7b_tuned`, collectives free",
                          "--model gpt-7b --gpus-per-node 8 --nodes 8 --free --inter-gbps --deepspeed-config "
                          "benchmarks/configs/gpt7b_tuned.json --configs unquantized ours-qwz-qgz ours-qwz-qgz-hpz "
                          "--reps 3 --steps 3 --warmup 1 --no-profile"),
    "n2_validation": ("1.4B GPT, 2 ranks as 2 nodes over the link fitted to the committed 2-GPU socket runs",
                      "--model gpt-1.4b --gpus-per-node 1 --nodes 2 --inter-gbps 32 --inter-alpha-us 50 --configs "
                      "unquantized ours-qwz-qgz upstream-qwz-qgz --reps 3 --steps 5 --warmup 1 --no-profile"),
}
MEASURED_2GPU = "e2e_slow.json"  # benchmarks/e2e.py --link slow: NCCL over sockets, 2 H200 as 2 nodes


def run(names, out):
    for name in names:
        path = out / f"simulated_{name}.json"
        command = [
            sys.executable, "-m", "deepspeed_zeropp", "simulate", *SETTINGS[name][1].split(), "--json",
            str(path)
        ]
        print("+", " ".join(command), flush=True)
        status = subprocess.run(command, cwd=REPO).returncode
        if path.exists():
            results = json.loads(path.read_text())
            path.write_text(json.dumps({"name": path.stem, "commit": commit(), **results}, indent=1))
        if status:
            print(f"{name}: exit {status}")


def render(out):
    loaded = {
        name: json.loads((out / f"simulated_{name}.json").read_text())
        for name in SETTINGS if (out / f"simulated_{name}.json").exists()
    }
    lines = [
        "# ZeRO++ at 2 to 64 ranks, simulated on one GPU", "",
        "Rank 0 of each job runs on one GPU (`deepspeed_zeropp/simulate/`: DeepSpeed and the patch unchanged, only "
        "the process group and the node's device count replaced). Generated by `benchmarks/simulated_world.py "
        "render` from the `simulated_*.json` beside this file. Per configuration: the median step time of each "
        "repetition, their median and min-max; a ratio (speed-up: the other's step time over this one's) is taken "
        "within each repetition, *(noise)* where its min-max spans 1. Host CPU time counts the wait for the GPU as "
        "busy (CUDA synchronisation spins), so it equals the step time when the GPU bounds the step too. Launches: "
        "GPU kernels per step (a simulated collective is one copy kernel, as an NCCL collective is one kernel). "
        "Host waits: the CUDA runtime's synchronize calls per step, each a stall of the host until the GPU has caught "
        "up (- where a run was not profiled). Collectives and MiB are per step; MiB are what this rank sends under the ring algorithm "
        "(`deepspeed_zeropp/simulate/link.py`)."
        " Comm waited / exposed / modelled ms: exposed is the time per step during which a collective runs on a "
        "process group's stream while no other GPU work runs, waited the part of it during which the GPU work that "
        "follows had already been launched by the host (so the step paid it; where the host is the bound, exposed "
        "time is hidden behind the host's work) (`deepspeed_zeropp/simulate/timeline.py`, two profiled steps under "
        "the link), over the link model's time of the timed steps; - where not profiled or, for waited, measured "
        "before that figure existed. The link model (`deepspeed_zeropp/simulate/link.py`): a ring across nodes sends "
        "through every NIC its ranks have on a node (NCCL spreads its channels over them), so a world-wide "
        "all-gather or reduce-scatter crosses the network at GPUs per node times one GPU's NIC, and qgZ's "
        "inter-node all-to-alls (one rank per node) at one NIC; settings measured before 5bdda0e charged every "
        "ring at one GPU's NIC, which makes their \"100 Gbit/s per GPU\" a cluster of 100 Gbit/s per node for "
        "the world-wide collectives (and its qgZ all-to-alls 8 times too fast): their JSON names the commit. What "
        "it leaves out: every process group has its own stream and each collective gets its full bandwidth "
        "whatever else is in flight, so collectives of different groups that cross one NIC at once (in backward: "
        "weight re-fetches on the world group beside gradient reduce-scatters on DeepSpeed's clone of it, or qgZ's "
        "inter-node all-to-alls) each run at full speed where on a cluster they would share it, taking up to twice "
        "as long. Link time and exposed communication are therefore optimistic by up to the time two or more "
        "communication streams run at once (`comm_concurrent_ms_per_step` in the JSON, an upper bound: it also "
        "counts NVLink beside NIC traffic); forward, which only gathers, is not affected.", ""
    ]
    for name, results in loaded.items():
        table, ratios = report.summary(results)
        topology = results["topology"]
        lines += [
            f"## {name}: {SETTINGS[name][0]}", "",
            f"Commit {results.get('commit', '?')}, {results.get('gpu', 'one H200')}; "
            f"{results['parameters'] / 1e9:.2f}B parameters, rank 0 of "
            f"{topology['world_size']} ({topology['nodes']} x {topology['gpus_per_node']}); micro-batch "
            f"{results['settings']['micro_batch']} x {results['shape']['seq']} tokens, bf16; "
            f"{len(results['reps'])} repetition{'s' * (len(results['reps']) != 1)} of "
            f"{results['settings']['steps']} timed steps per link. Checks: " +
            ("every run: no skipped step, finite losses, its quantized paths ran."
             if not report.problems(results) else "FAILED: " + "; ".join(report.problems(results))) +
            (f" GPU kernel ms and launches: {results['profile']}." if results.get("profile") else ""), ""
        ]
        if _old_model(results):
            lines += [
                "Measured under the old link model (before 5bdda0e): read its per-GPU speeds as per node for the "
                "world-wide collectives; its qgZ all-to-alls ran 8 times too fast.", ""
            ]
        for link, description in results["links"].items():
            lines += [f"**{link}** ({description})", "", report.markdown_table(table, ratios, link), ""]
    lines += levers(loaded, out)
    lines += bounds(loaded)
    lines += targets(loaded)
    lines += validation(loaded.get("n2_validation"), out)
    (out / "simulated_world.md").write_text("\n".join(lines) + "\n")
    plot(loaded, out / "simulated_world.png")
    print(f"wrote {out / 'simulated_world.md'} and .png")


def _old_model(results):
    """Whether ``results`` were measured under the link model before 5bdda0e where it differs from today's: a
    modelled link across nodes of several GPUs."""
    topology = results["topology"]
    return (results.get("link_model", 1) < 2 and topology["nodes"] > 1 and topology["gpus_per_node"] > 1
            and any("across nodes" in d for d in results["links"].values()))


def _ratio(loaded, name, link, pair):
    results = loaded.get(name)
    if results is None or link not in results["links"]:
        return None
    return report.summary(results)[1][link].get(pair)


def _text(spread):
    return "not measured" if spread is None else f"{spread['median']:.2f}x ({spread['low']:.2f}-{spread['high']:.2f})"


def levers(loaded, out):
    """What each change to the quantized path bought, where a setting measured it side by side."""
    rows = ["## What each lever bought", ""]
    n8 = loaded.get("n8_free")
    if n8 and "ours-qwz-two-gathers" in n8["configs"]:
        table = report.summary(n8)[0]["free"]
        values = [
            rep["ours-qwz-two-gathers"]["by_link"]["free"]["median_ms"] /
            rep["ours-qwz"]["by_link"]["free"]["median_ms"] for rep in n8["reps"]
        ]
        two, one = (table[k] for k in ("ours-qwz-two-gathers", "ours-qwz"))
        rows.append(
            f"- One all-gather per quantized fetch (codes and scales in one packet, the seam at "
            f"`_dist_allgather_fn`), `n8_free`: collectives per step "
            f"{sum(two['collectives_per_step'].values()):.0f} -> {sum(one['collectives_per_step'].values()):.0f}"
            f", kernel launches {two['kernel_launches_per_step']:.0f} -> {one['kernel_launches_per_step']:.0f}"
            f", speed-up {min(values):.2f}-{max(values):.2f}x (median {statistics.median(values):.2f}x): "
            f"within noise where collectives are free; its worth is a latency per fetch on a real link.")
    if (out / "packets.md").exists():
        rows.append("- The CUDA backend's packet entry points (quantize into the packet, dequantize the gathered "
                    "packets in place): one kernel each way instead of three, 2.1-2.4x less time per call "
                    "(`packets.md`); in `n8_free` the launches above unquantized fell from 4.0 to 2.0 per quantized "
                    "fetch (3065 -> 2759 per step, 52c7265 -> 1bb32b1).")
    if (out / "host_profile.md").exists():
        rows.append("- Releases after a fetch go straight to DeepSpeed's `_partition_param` (no rank lookup, no "
                    "padding check): the package's largest host work before (95 ms per step under cProfile at "
                    "23003ad); all of the package's own functions now take 25 ms per step under cProfile "
                    "(`host_profile.md`, 373133f), where ours qwZ's whole step (980 ms) is below upstream's (998 ms) "
                    "and 177 ms above unquantized (803 ms): the rest of that difference is DeepSpeed's own "
                    "quantized-fetch code and torch's dispatch of the quantize and dequantize tensors.")
    rows.append("- The CUDA extension's native call-signature tables (a C lookup before `ops`' Python one) were "
                "dropped: ZeRO-3's quantized fetches take the packet entry points, which never reached them, so "
                "`n8_free`'s launches and collectives are unchanged (2759 and 543 per step, c35c9a5 and 373133f).")
    rows.append(
        "- Init's coalesced gather kept whole on NCCL (and the simulated world): a quantized job's seam had "
        "split every list into one call per parameter (needed where gloo completes all-gathers out of "
        "order), and DeepSpeed ends each call with a device synchronization, so the persistent parameters' "
        "gather after every step stalled the host once per parameter: 196 cudaDeviceSynchronize calls per "
        "step of ours qwZ against 4 unquantized (CUDA runtime calls under torch.profiler, 0e95f3e); host "
        "waits per step (device, stream and event synchronizations) now 10 for every configuration (`n8_free`, db1300f). Most of them fall where the step's "
        "`loss.item()` waits for the GPU anyway, so the step time shows little of it here (about 3 ms per "
        "step of runtime calls); a loop that does not wait each step kept the stalls.")
    if (out / "qgz_batching.md").exists():
        rows.append("- qgZ's shared all-to-alls (one per batch of gradients, not per gradient): measured alone in "
                    "`qgz_batching.md` (host work and launches, one rank).")
    rows += [
        "", "Step times on this shared host vary by about 20% from one step to the next, within one engine and one "
        "configuration, so repetitions cannot place a ratio within 3% (the step-time targets below): `n8_free` at "
        "c35c9a5 (3 repetitions of 10 steps) gave ours qwZ 1.05x (0.80-1.18) unquantized's speed, at 373133f 0.81x "
        "(0.72-0.82), at db1300f (8 repetitions of 3 steps) 0.87x (0.63-1.32), with the same launches, host waits "
        "and collectives. Stepped one step at a time (A B C D, 10 rounds, 0e95f3e; a one-off script, not kept), ours qwZ's median step was "
        "517 ms against unquantized's 523 and upstream's 525 (per-round speed-up median 0.95x, quartiles "
        "0.92-1.10). The launch, host-wait, collective and host-profile figures are the ones that do not move "
        "between runs."
    ]
    rows.append("")
    return rows


def bounds(loaded):
    """Each profiled step against its two bounds: max(collectives-free step, modelled link time), where all of the
    link may hide behind any compute, and the phase-wise bound (report.phase_bound), where forward's link can only
    hide behind forward's work."""
    rows = []
    for name, results in loaded.items():
        table = report.summary(results)[0]
        for key, run in results.get("runs", {}).items():
            free = {k: v for k, v in run.items() if k.startswith(("host_", "compute_"))}
            for link, linked in run.get("profiled_links", {}).items():
                found = report.phase_bound(free, linked)
                if found is None or key not in table.get(link, {}):
                    continue
                step = table[link][key]["step_ms"]["median"]
                free_step = sum(run[f"host_{phase}_ms_per_step"] for phase in ("forward", "backward", "step"))
                modelled = linked["modelled_link_ms_per_step"]
                phases = " + ".join(f"{max(pair):.0f}" for pair in found["phases"].values())
                pairs = ", ".join(f"{phase} {a:.0f} / {b:.0f}" for phase, (a, b) in found["phases"].items())
                rows.append(f"| {name} | {link} | {CONFIGS[key].label} | {step:.0f} | {free_step:.0f} | "
                            f"{modelled:.0f} | {step / max(free_step, modelled):.2f} | {pairs} | "
                            f"{phases} = {found['bound']:.0f} | {step / found['bound']:.2f} |")
    if not rows:
        return []
    return [
        "## The step against its bounds", "",
        "Profiled steps (one repetition each): the step (median of the timed steps), the collectives-free step (the "
        "profile without a link: the host windows of forward, backward and the optimizer step, the loss's wait "
        "included) and the link model's time; the phase-wise bound adds, per phase, the longer of its "
        "collectives-free time (host window or GPU compute, whichever is longer) and the link time of the "
        "collectives launched in it (`report.phase_bound`): forward's all-gathers need the weights the last "
        "optimizer step wrote, so they cannot hide behind the last backward.", "",
        "| setting | link | configuration | step ms | free step ms | link ms | step / max(free, link) | per phase, "
        "free / link ms | phase-wise bound ms | step / phase-wise bound |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, ""
    ]


def targets(loaded):
    """The targets of this benchmark, each with the figure that decides it."""
    rows = ["## Targets", "", "| target | figure | held |", "|---|---|---|"]

    def row(target, spread, held):
        rows.append(f"| {target} | {_text(spread)} | {'yes' if held else 'no'} |")

    def faster(spread, bound):  # speed-up at least ``bound``, beyond the spread
        return spread is not None and spread["low"] >= bound

    def median_at_least(spread, bound):
        return spread is not None and spread["median"] >= bound

    n8 = loaded.get("n8_free")
    if n8:
        table = report.summary(n8)[0]["free"]
        fetches = sum(n for k, n in table["ours-qwz"]["collectives_per_step"].items() if "/uint8/" in k)
        extra = table["ours-qwz"]["kernel_launches_per_step"] - table["unquantized"]["kernel_launches_per_step"]
        upstream = table["upstream-qwz"]["kernel_launches_per_step"]
        rows.append(
            f"| N = 8, free: ours qwZ at most 3 more launches per quantized fetch than unquantized, and "
            f"fewer than upstream | {extra:.0f} more over {fetches:.0f} fetches: {extra / fetches:.1f} per "
            f"fetch; {table['ours-qwz']['kernel_launches_per_step']:.0f} vs upstream's {upstream:.0f} | "
            f"{'yes' if extra <= 3 * fetches and table['ours-qwz']['kernel_launches_per_step'] < upstream else 'no'} |"
        )
        ours_c = sum(table["ours-qwz"]["collectives_per_step"].values())
        plain_c = sum(table["unquantized"]["collectives_per_step"].values())
        rows.append(f"| N = 8, free: ours qwZ no more collectives than unquantized | {ours_c:.0f} vs {plain_c:.0f} | "
                    f"{'yes' if ours_c <= plain_c else 'no'} |")
        spread = _ratio(loaded, "n8_free", "free", "ours-qwz vs unquantized")
        row("N = 8, free: ours qwZ step at most 1.03x unquantized's (speed-up >= 0.97)", spread, faster(spread, 0.97))
        spread = _ratio(loaded, "n8_free", "free", "ours-qwz vs upstream-qwz")
        row("N = 8, free: ours qwZ no slower than upstream, beyond the spread", spread, faster(spread, 1.0))
    spread = _ratio(loaded, "n16_free", "free", "ours-qwz-qgz vs unquantized")
    row("N = 16, free: ours qwZ+qgZ step at most 1.05x unquantized's (speed-up >= 0.95)", spread, faster(spread, 0.95))
    spread = _ratio(loaded, "n16_free", "free", "ours-qwz-qgz vs upstream-qwz-qgz")
    row("N = 16, free: ours qwZ+qgZ no slower than upstream, beyond the spread", spread, faster(spread, 1.0))
    for name, link, bound in (("n64_7b_100g", "12.5 Gbit/s", 3.0), ("n64_7b_400g", "50 Gbit/s", 1.5)):
        spread = _ratio(loaded, name, link, "ours-qwz-qgz-hpz vs unquantized")
        row(f"7B, N = 64, {link} per GPU: ours qwZ+qgZ+hpZ >= {bound}x unquantized", spread, faster(spread, bound))
    spread = _ratio(loaded, "n64_7b_100g", "12.5 Gbit/s", "ours-qwz-qgz-hpz vs upstream-qwz-qgz-hpz")
    row("7B, N = 64, 100 Gbit/s a node: ours qwZ+qgZ+hpZ >= 1.05x upstream, beyond the spread", spread,
        faster(spread, 1.05))
    spread = _ratio(loaded, "n8_free", "NVLink", "ours-qwz vs unquantized")
    row("one NVLink node (N = 8, modelled link): ours qwZ >= 1.0x unquantized", spread, faster(spread, 1.0))
    # the "auto" bucket sizes: judged on the median (the host's noise spans these ratios' spreads)
    spread = _ratio(loaded, "n8_auto", "free", "ours-qwz vs unquantized")
    row("N = 8, free, \"auto\": ours qwZ step at most 1.05x unquantized's (median speed-up >= 0.952)", spread,
        median_at_least(spread, 1 / 1.05))
    spread = _ratio(loaded, "n8_auto", "free", "ours-qwz vs upstream-qwz")
    row("N = 8, free, \"auto\": ours qwZ no slower than upstream (median)", spread, median_at_least(spread, 1.0))
    spread = _ratio(loaded, "n16_100g_auto", "12.5 Gbit/s", "ours-qwz-qgz vs unquantized")
    row("N = 16, 100 Gbit/s a node, \"auto\": ours qwZ+qgZ >= 1.2x unquantized (median)", spread,
        median_at_least(spread, 1.2))
    spread = _ratio(loaded, "n16_100g_tuned", "12.5 Gbit/s", "ours-qwz-qgz vs unquantized")
    row("N = 16, 100 Gbit/s a node, searched sizes: ours qwZ+qgZ >= 1.6x unquantized at the same sizes (median)",
        spread, median_at_least(spread, 1.6))
    for name in ("n16_100g_auto", "n16_100g_tuned"):
        spread = _ratio(loaded, name, "12.5 Gbit/s", "ours-qwz-qgz vs upstream-qwz-qgz")
        row(f"`{name}`: ours qwZ+qgZ faster than upstream, beyond the spread", spread, faster(spread, 1.0))
    # every configuration at the searched sizes: the same sizes for unquantized too
    for link, bound in (("12.5 Gbit/s", 3.4), ("50 Gbit/s", 1.8)):
        per_node = f"{link} per GPU ({float(link.split()[0]) * 8:g} a node)"
        spreads = [(key, _ratio(loaded, "n64_7b_tuned", link, f"{key} vs unquantized"))
                   for key in ("ours-qwz-qgz", "ours-qwz-qgz-hpz")]
        key, spread = max(spreads, key=lambda pair: pair[1]["median"] if pair[1] else 0)
        row(
            f"7B, N = 64, {per_node}, searched sizes: best of ours ({CONFIGS[key].label}) >= {bound}x "
            "unquantized at the same sizes (median)", spread, median_at_least(spread, bound))
        for key in ("ours-qwz-qgz", "ours-qwz-qgz-hpz"):
            spread = _ratio(loaded, "n64_7b_tuned", link, f"{key} vs {key.replace('ours', 'upstream')}")
            row(
                f"7B, N = 64, {per_node}, searched sizes: {CONFIGS[key].label} faster than upstream, beyond the "
                "spread", spread, faster(spread, 1.0))
    rows.append("")
    return rows


def validation(simulated, out):
    """The simulated 2-rank ratios beside the measured 2-GPU ones."""
    if simulated is None or not (out / MEASURED_2GPU).exists():
        return []
    measured = json.loads((out / MEASURED_2GPU).read_text())
    _, ratios = report.summary(simulated)
    link = next(iter(simulated["links"]))
    rows = [
        "## The link model against the 2-GPU runs", "",
        f"Measured: `{MEASURED_2GPU}` (commit {measured['commit']}, 2 H200 as 2 nodes, NCCL over sockets, "
        f"1.31B GPT with tied embeddings, reduce bucket 2^22, persistence threshold 0). Simulated: "
        f"`simulated_n2_validation.json`, 1.42B GPT (untied head), the HF Trainer's bucket sizes, over "
        f"{simulated['links'][link]}: alpha and beta fitted by hand to the measured run's NCCL kernel times "
        f"(`e2e_slow_profile.md`: 288 all-gathers of mostly int8 codes in 1010 ms over 3 steps, about 4 GB/s), "
        f"not to its step times.", "", "| figure | measured | simulated |", "|---|---|---|"
    ]
    step = report.summary(simulated)[0][link]["unquantized"]["step_ms"]
    rows.append(f"| unquantized step, ms | {measured['summary']['unquantized']['median_ms']:.0f} | "
                f"{step['median']:.0f} |")
    for key in ("ours-qwz-qgz vs unquantized", "upstream-qwz-qgz vs unquantized", "ours-qwz-qgz vs upstream-qwz-qgz"):
        real, sim = measured["ratios"].get(key), ratios[link].get(key)
        if real and sim:
            rows.append(f"| {key} | {real['ratio']:.2f}x ({real['low']:.2f}-{real['high']:.2f}) | "
                        f"{sim['median']:.2f}x ({sim['low']:.2f}-{sim['high']:.2f}) |")
    rows += [
        "", "What the model leaves out: NCCL's own use of SMs and memory bandwidth (only the simulated copies "
        "run), several communicators sharing one link at once (each group queues on its own stream), protocol "
        "effects (LL vs Simple, socket threads), and NCCL's launch cost (the simulated group's Python stands in "
        "for it).", ""
    ]
    return rows


def plot(loaded, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no .png")
        return
    panels = [(name, link) for name, results in loaded.items() for link in results["links"]]
    columns = 5
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 4.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (name, link) in zip(axes.flat, panels):
        table, ratios = report.summary(loaded[name])
        keys = [k for k in table[link] if k != "unquantized"]
        values = [ratios[link][f"{k} vs unquantized"] for k in keys]
        ax.bar(range(len(keys)), [v["median"] for v in values],
               yerr=[[v["median"] - v["low"] for v in values], [v["high"] - v["median"] for v in values]],
               color=["tab:blue" if CONFIGS[k].patched else "tab:gray" for k in keys],
               capsize=3)
        ax.axhline(1.0, color="black", linewidth=0.8)
        labels = [CONFIGS[k].label.split(",")[0] + (" (variant)" if "," in CONFIGS[k].label else "") for k in keys]
        ax.set_xticks(range(len(keys)), labels, rotation=45, ha="right", fontsize=7)
        model = ", old link model" if _old_model(loaded[name]) else ""
        ax.set_title(f"{name}{model}\n{link}, {loaded[name].get('gpu', 'one H200')}", fontsize=8)
    for row in axes:
        row[0].set_ylabel("speed-up over unquantized ZeRO-3", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "render"))
    parser.add_argument("names", nargs="*", choices=[[]] + list(SETTINGS), default=[])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.action == "run":
        run(args.names or list(SETTINGS), args.out)
    render(args.out)


if __name__ == "__main__":
    main()
