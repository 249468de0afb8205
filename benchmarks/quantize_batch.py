"""A forward's quantizes one by one against one batch (``ops.quantize_packed_many``), on the CUDA backend: rank 0's
partitions of the weights the simulated world's 1.4B GPT quantizes per step (those above the HF Trainer's "auto"
persistence threshold, 10 x width: 99 matrices), at 8 and 64 ranks, bf16. Timed interleaved in one process (the
order rotated every trial), wall time per step between CUDA events, so host work counts wherever it outlasts the
kernels; kernel launches counted with the profiler; the packets compared bit for bit.

    python benchmarks/quantize_batch.py [--out benchmarks/results]      (a CUDA GPU)
writes quantize_batch.{json,md}.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deepspeed_zeropp import ops  # noqa: E402
from deepspeed_zeropp.simulate import model  # noqa: E402
from benchmarks.common import environment, interleaved, paired_ratio  # noqa: E402

WORLD_SIZES = (8, 64)
TRIALS, REPS = 15, 10


def partitions(ranks):
    """Rank 0's partition of every weight the 1.4B quantizes at ``ranks`` ranks (DeepSpeed's rounded-up share)."""
    shape = model.SHAPES["gpt-1.4b"]
    with torch.device("meta"):
        numels = [p.numel() for p in model.GPT(shape).parameters() if p.numel() > 10 * shape.width]
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn((n + ranks - 1) // ranks, device="cuda", generator=gen).to(torch.bfloat16) for n in numels]


def launches(fn):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn()
        torch.cuda.synchronize()
    return sum(1 for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def measure():
    rows = []
    for ranks in WORLD_SIZES:
        xs = partitions(ranks)
        one_by_one = lambda _: [ops.quantize_packed(x, backend="cuda") for x in xs]  # noqa: E731
        batch = lambda _: ops.quantize_packed_many(xs, backend="cuda")  # noqa: E731
        for a, b in zip(one_by_one(None), batch(None)):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for _ in range(5):
            one_by_one(None), batch(None)
        samples = interleaved({"one by one": (one_by_one, [None]), "batch": (batch, [None])}, REPS, TRIALS)
        read = sum(x.numel() * x.element_size() for x in xs)
        row = dict(ranks=ranks, partitions=len(xs), mib_read=read / 2**20)
        for name, fn in (("one by one", one_by_one), ("batch", batch)):
            ms = [s * 1e3 for s in samples[name]]
            row[name] = dict(ms=statistics.median(ms),
                             low=min(ms),
                             high=max(ms),
                             launches=launches(lambda: fn(None)),
                             gbps=read / statistics.median(samples[name]) / 1e9)
        row["speed-up"] = paired_ratio(samples["batch"], samples["one by one"])
        rows.append(row)
    return rows


def markdown(result):
    env = result["environment"]
    lines = [
        "# A forward's quantizes: one by one or one batch", "",
        f"{env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, commit {env['commit']}; "
        f"`python benchmarks/quantize_batch.py`: rank 0's bf16 partitions of the 1.4B GPT's quantized weights, "
        f"{TRIALS} interleaved trials of {REPS} calls, wall time between CUDA events (host included), median "
        "(min-max); launches from the profiler; packets bit for bit equal.", "",
        "| ranks | partitions | MiB read | one by one ms | launches | batch ms | launches | batch GB/s | speed-up |",
        "|---|---|---|---|---|---|---|---|---|"
    ]
    for row in result["rows"]:
        a, b, s = row["one by one"], row["batch"], row["speed-up"]
        lines.append(f"| {row['ranks']} | {row['partitions']} | {row['mib_read']:.1f} | {a['ms']:.3f} "
                     f"({a['low']:.3f}-{a['high']:.3f}) | {a['launches']} | {b['ms']:.3f} ({b['low']:.3f}-"
                     f"{b['high']:.3f}) | {b['launches']} | {b['gbps']:.0f} | {s['ratio']:.2f}x "
                     f"({s['low']:.2f}-{s['high']:.2f}) |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    result = dict(environment=environment(), rows=measure())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quantize_batch.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "quantize_batch.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
