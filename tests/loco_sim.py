"""LoCo's effect, simulated: every rank of a qgZ reduce-scatter in one process (tests/qgz_sim.py) called on the same
gradients step after step, with and without error feedback, against the exact mean.

The gradients are what 4-bit qgZ loses outright: in every 256-value group one value of magnitude ~1 and the others
between 0.01 and 0.06 of it, below half a 4-bit step (1/14), so without feedback they round to 0 at the first stage on
every call. With feedback each stage carries what it dropped into its next call, so the running mean of the reduced
gradient converges to the exact mean (its error is at most the last carried errors over (1 - beta) T).

    python -m tests.loco_sim     # the table quoted in README.md (LoCo)
"""
import torch

from deepspeed_zeropp.backends import torch_ref
from deepspeed_zeropp.formats.dtypes import SUPPORTED_DTYPES
from deepspeed_zeropp.loco import error_sizes
from deepspeed_zeropp.formats.int4 import GROUP, Feedback, weights
from tests.qgz_sim import reduce_scatter


def hard_gradients(world, numel, seed, small=(0.01, 0.06)):
    """Per rank: small values (between ``small``, random sign) with one value of magnitude 0.5 to 1 per group."""
    gen = torch.Generator().manual_seed(seed)
    gradients = []
    for _ in range(world):
        small_values = (small[0] + (small[1] - small[0]) * torch.rand(numel, generator=gen)) * torch.where(
            torch.rand(numel, generator=gen) < 0.5, -1.0, 1.0)
        large = 0.5 + 0.5 * torch.rand(numel, generator=gen)
        gradients.append(torch.where(torch.arange(numel) % GROUP == 3, large, small_values).double())
    return gradients


def feedbacks(numel, world, local_size, err_beta, device="cpu"):
    """Fresh per-rank error buffers, sized and paired as deepspeed_zeropp.loco keeps them on a parameter."""
    beta, keep = weights(err_beta)
    intra, inter = error_sizes(numel, world, local_size)
    return [(Feedback(torch.zeros(intra, device=device), beta,
                      keep), Feedback(torch.zeros(inter, device=device), beta, keep) if inter else None)
            for _ in range(world)]


def running_mean_error(world,
                       local_size,
                       dtype,
                       steps,
                       err_beta=None,
                       drift=0.0,
                       store_dtype=torch.float32,
                       numel=4 * GROUP * 8,
                       seed=0,
                       small=(0.01, 0.06)):
    """Max |running mean of the reduced gradient - running mean of the exact means rounded to ``dtype`` (what an
    unquantized reduce-scatter returns)| over every rank's partition after ``steps`` calls, relative to the largest
    gradient value. ``err_beta`` None: plain qgZ (no feedback). ``drift``:
    gradient t is gradient 0 times (1 + drift * t). ``store_dtype``: error buffers rounded to it after every call
    (what keeping them in the gradient's dtype would do)."""
    base = hard_gradients(world, numel, seed, small)
    state = None if err_beta is None else feedbacks(numel, world, local_size, err_beta)
    total = exact = None
    for t in range(steps):
        gradients = [g * (1 + drift * t) for g in base]
        reduced = reduce_scatter([g.to(dtype) for g in gradients], local_size, torch_ref, state)
        reduced = torch.cat([r.double() for r in reduced])
        mean = torch.stack([g.to(dtype).double() for g in gradients]).mean(0).to(dtype).double()
        total = reduced if total is None else total + reduced
        exact = mean if exact is None else exact + mean
        if state is not None and store_dtype != torch.float32:
            for pair in state:
                for fb in pair:
                    if fb is not None:
                        fb.error.copy_(fb.error.to(store_dtype).float())
    largest = max(g.abs().max().item() for g in base) * (1 + max(drift, 0) * (steps - 1))
    return ((total - exact) / steps).abs().max().item() / largest


def main():
    print("| nodes x ranks | gradients | calls | qgZ | LoCo beta 0 | LoCo beta 0.8 | beta 0.8, errors kept in the "
          "gradient's dtype |")
    print("|---|---|---|---|---|---|---|")
    for world, local_size in ((2, 1), (4, 2)):
        for dtype in SUPPORTED_DTYPES:
            for steps in (64, 1024):
                args = dict(world=world, local_size=local_size, dtype=dtype, steps=steps, numel=1024 * world)
                figures = [running_mean_error(**args, err_beta=beta) for beta in (None, 0.0, 0.8)]
                stored = running_mean_error(**args, err_beta=0.8, store_dtype=dtype)
                row = [f"{world // local_size}x{local_size}", str(dtype)[6:], steps] + [f"{x:.2e}" for x in figures]
                print("| " + " | ".join(map(str, row + ["same" if dtype == torch.float32 else f"{stored:.2e}"])) +
                      " |",
                      flush=True)


if __name__ == "__main__":
    main()
