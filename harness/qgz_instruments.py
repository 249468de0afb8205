"""qgZ's reduce-scatter measured inside the harness's ranks: accuracy against the exact mean and time per call.

A harness instrument module (``spec["instruments"] = "harness.qgz_instruments"``; hooks as described in
harness/worker.py): a run with ``qgz_check`` set runs no training but :func:`qgz_check` on its
``cases`` ([dtype name, shape] pairs), gradients times ``scale``, timed over ``time_reps`` calls. Used by
benchmarks/qgz_gpu.py and tests/multirank/test_qgz.py.
"""
import math
import time

import torch

from deepspeed_zeropp.formats.dtypes import BY_NAME as DTYPES


def time_reduce(reduce, gradient, groups, reps):
    """Median wall time (ms) of one quantized reduce-scatter over ``reps`` calls after warm-up; None if reps is 0."""
    if not reps:
        return None
    times = []
    for i in range(reps + 3):
        torch.distributed.barrier()
        if gradient.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        reduce([gradient], groups)
        if gradient.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times[3:])[reps // 2]


def qgz_check(job):
    """qgZ's reduce-scatter on random gradients against the exact mean (fp64), per dtype and shape. Figures are the
    worst over ranks; errors are relative to the largest gradient value; ``error_of_rounded_mean`` is the distance to
    the exact mean rounded once to the dtype (0 up to fp32 summation for the unquantized path)."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero import stage3
    from deepspeed.utils import groups
    from deepspeed_zeropp.qgz import quantizes
    run, rank = job.run, job.rank
    world = torch.distributed.get_world_size()
    all_to_all_groups = groups._get_local_all_to_all_group()
    report = []
    for dtype_name, shape in run["cases"]:

        def gradient_of(r):  # every rank's gradient, rebuilt locally from its seed
            generator = torch.Generator().manual_seed(17 * r + len(report))
            return (torch.randn(shape, generator=generator) * run.get("scale", 1.0)).to(DTYPES[dtype_name])

        gradient = gradient_of(rank).to(get_accelerator().current_device_name())
        reduced = stage3.all_to_all_quant_reduce([gradient], all_to_all_groups)[0]
        everyone = torch.stack([gradient_of(r).double() for r in range(world)])
        mean = everyone.mean(dim=0).reshape(-1)
        chunk = -(-mean.numel() // world)
        expected = mean[rank * chunk:(rank + 1) * chunk]
        largest = everyone.abs().max().item() if everyone.numel() else 1.0
        got = reduced.cpu().double()
        if got.shape != expected.shape:  # reported as a wrong numel; the error figures become inf
            got = torch.full_like(expected, math.nan)
        error = (got - expected).abs()
        rounded = expected.to(reduced.dtype).double()
        ms = time_reduce(stage3.all_to_all_quant_reduce, gradient, all_to_all_groups, run.get("time_reps", 0))
        figures = [
            error.max().item() / largest if error.numel() else 0.0,
            (got - rounded).abs().max().item() / largest if error.numel() else 0.0,
            (error.pow(2).mean() / expected.pow(2).mean()).sqrt().item() if error.numel() else 0.0,
            float(reduced.numel() != expected.numel()),
            float(not torch.isfinite(reduced).all()),
        ]
        figures = torch.tensor(figures, dtype=torch.float64, device=gradient.device).nan_to_num(nan=math.inf)
        torch.distributed.all_reduce(figures, op=torch.distributed.ReduceOp.MAX)  # the worst rank's
        worst, worst_rounded, rms_error, wrong_numel, not_finite = figures.tolist()
        report.append(
            dict(dtype=str(reduced.dtype),
                 numel=reduced.numel(),
                 expected_numel=expected.numel(),
                 every_rank_numel_right=not wrong_numel,
                 quantized=quantizes(gradient, world),
                 ms=ms,
                 max_error_of_largest=worst,
                 error_of_rounded_mean=worst_rounded,
                 rms_error_of_rms=rms_error,
                 finite=not not_finite))
    return {"cases": report}


def qgz_batches(job):
    """One call's gradients (``qgz_batches``: [dtype name, shape] pairs, 4-bit and unquantized mixed) reduced with
    their 4-bit all-to-alls shared in batches, against one call per gradient: the number of mismatching results
    (bit patterns) per batch limit, the worst rank's, with LoCo's error buffers (random at the start, the same for
    every variant) compared too when ``loco`` is set; and the all-to-alls and batches each variant made."""
    from deepspeed import comm as ds_comm
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils import groups
    from deepspeed_zeropp import qgz
    from deepspeed_zeropp.formats.int4 import Feedback, weights
    from deepspeed_zeropp.loco import error_sizes
    run, device = job.run, get_accelerator().current_device_name()
    all_to_all_groups = groups._get_local_all_to_all_group()
    topology = qgz.topology()
    world, local_size = topology.world, topology.local_size
    generator = torch.Generator().manual_seed(1000 + job.rank)
    gradients = [
        torch.randn(shape, generator=generator).to(DTYPES[name]).to(device) for name, shape in run["qgz_batches"]
    ]
    starting_errors = [
        [torch.randn(n, generator=generator).to(device)
         for n in error_sizes(g.numel(), world, local_size)] if qgz.quantizes(g, world) else None for g in gradients
    ]
    beta, keep = weights(0.8)

    def variant(limit, one_by_one):
        """(results, final errors, all-to-alls made) with batches of at most ``limit`` bytes."""
        errors = [[e.clone() for e in pair] if pair else None for pair in starting_errors]
        feedbacks = [(Feedback(pair[0], beta, keep),
                      Feedback(pair[1], beta, keep) if local_size > 1 else None) if pair and run.get("loco") else None
                     for pair in errors]
        # qgZ's all-to-alls go through DeepSpeed's comm (looked up at each call): counted there
        calls, original, saved = [], ds_comm.all_to_all_single, qgz.BATCH_BYTES
        ds_comm.all_to_all_single = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
        qgz.BATCH_BYTES = limit
        try:
            if one_by_one:
                results = [
                    qgz.reduce_scatter([g], all_to_all_groups, topology, [f])[0] for g, f in zip(gradients, feedbacks)
                ]
            else:
                results = qgz.reduce_scatter(gradients, all_to_all_groups, topology, feedbacks)
        finally:
            ds_comm.all_to_all_single, qgz.BATCH_BYTES = original, saved
        return results, [e for pair in errors if pair for e in pair], len(calls)

    def mismatches(first, second):
        return [
            i for i, (a, b) in enumerate(zip(first, second))
            if not torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        ]

    four_bit = [i for i, g in enumerate(gradients) if qgz.quantizes(g, world)]
    sizes = [qgz.sent_bytes(qgz.padded_chunk_of(gradients[i].numel(), world), world) for i in four_bit]
    limits = {"default": qgz.BATCH_BYTES, "two_largest": sum(sorted(sizes)[-2:]), "one": 1}
    reference, reference_errors, _ = variant(qgz.BATCH_BYTES, one_by_one=True)
    report = {}
    for label, limit in limits.items():
        results, errors, calls = variant(limit, one_by_one=False)
        # The 4-bit results only: the unquantized ones' fp32 reduce-scatter sums in an order that may depend on what
        # else it carries (gloo), so they agree up to fp32 summation (qgz_check), not bit for bit.
        wrong = len(mismatches([results[i] for i in four_bit], [reference[i] for i in four_bit]))
        if run.get("loco"):
            wrong += len(mismatches(errors, reference_errors))
        worst = torch.tensor([wrong], device=gradients[0].device)
        torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
        report[label] = dict(mismatches=int(worst.item()),
                             all_to_alls=calls,
                             batches=len(list(qgz.batches(sizes, limit))))
    return {"quantized": len(sizes), "stages": 1 if local_size == 1 else 2, "variants": report}


RUNNERS = {"qgz_check": qgz_check, "qgz_batches": qgz_batches}
