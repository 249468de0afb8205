"""LoCo (ZeRO++ qgZ with error feedback, ``zeropp_loco_param``) that is correct for fp16, bf16 and fp32 gradients.

DeepSpeed's ``all_to_all_loco_quant_reduce(params, groups, loco_param)`` (0.16.2 to 0.19.7) reduces each
parameter's ``.grad`` like ``all_to_all_quant_reduce``, with kernels that read the gradient and its error buffers as
fp16 bits whatever their dtype. This one runs our qgZ (``qgz``: the same blocks, stages and unquantized path) with
each quantization compensated by the error it made before (``formats.int4.Feedback``), in the gradient's own dtype.

Config (``zeropp_loco_param``, as DeepSpeed documents it): ``err_beta`` in [0, 1] (default 0.8) weights the carried
error against the new one, ``e <- err_beta * e + (1 - err_beta) * (quantization error of e + input)``, at each
stage; ``reset_T`` (default 1024) clears a parameter's buffers after they served that many reductions.

Buffers, per parameter, under upstream's names so that ``DeepSpeedZeroOptimizer_Stage3._loco_err_buf_update`` keeps
working: ``param.intra_ef_buf`` (the error of quantizing this rank's gradient) and ``param.inter_ef_buf`` (of the
node-local sum; empty with one rank per node, where the gradient is quantized once), each a list
``[reductions served, fp32 error]``. Upstream keeps index 1 as the scales of the error's 8-bit codes, multiplies it
in place when the loss scale changes, and deletes both attributes after an overflow; here index 1 is the error
itself, so the same in-place product rescales it exactly, and a deleted buffer comes back as zeros. Errors are kept
in fp32: rounding them to bf16 would throw away what they carry (README, LoCo).
"""
import numbers

import torch

from . import qgz
from .formats.int4 import Feedback, weights

DEFAULTS = {"err_beta": 0.8, "reset_T": 1024}
INTRA, INTER = "intra_ef_buf", "inter_ef_buf"


def parse_loco_param(loco_param):
    """``zeropp_loco_param`` -> (beta, 1 - beta, reset_T); missing keys take DeepSpeed's documented defaults."""
    if loco_param is None:
        loco_param = {}
    if not isinstance(loco_param, dict):
        raise TypeError(f"loco_param (zeropp_loco_param) must be a dict with err_beta and reset_T, "
                        f"got {type(loco_param).__name__}")
    unknown = sorted(set(loco_param) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"loco_param (zeropp_loco_param): unknown keys {unknown}; accepted: err_beta, reset_T")
    err_beta = loco_param.get("err_beta", DEFAULTS["err_beta"])
    reset_t = loco_param.get("reset_T", DEFAULTS["reset_T"])
    if isinstance(err_beta, bool) or not isinstance(err_beta, numbers.Real) or not 0 <= err_beta <= 1:
        raise ValueError(f"loco_param['err_beta'] must be a number in [0, 1], got {err_beta!r}")
    if isinstance(reset_t, bool) or not isinstance(reset_t, numbers.Integral) or reset_t < 1:
        raise ValueError(f"loco_param['reset_T'] must be an integer >= 1, got {reset_t!r}")
    return (*weights(float(err_beta)), int(reset_t))


def error_sizes(numel, world, local_size):
    """fp32 values of (intra, inter) error for a ``numel``-value gradient: one per value each stage quantizes."""
    padded = qgz.padded_chunk_of(numel, world)
    return world * padded, (0 if local_size == 1 else world // local_size * padded)


def _buffers(param, sizes, device, reset_t):
    """The parameter's (intra, inter) fp32 errors for this reduction: zeros when new, deleted (overflow), of another
    layout, or after ``reset_t`` reductions; each call counts one reduction."""
    intra, inter = getattr(param, INTRA, None), getattr(param, INTER, None)
    fresh = (intra is None or inter is None or intra[0] >= reset_t
             or [intra[1].numel(), inter[1].numel()] != list(sizes) or intra[1].device != device)
    if fresh:
        intra = [0, torch.zeros(sizes[0], dtype=torch.float32, device=device)]
        inter = [0, torch.zeros(sizes[1], dtype=torch.float32, device=device)]
        setattr(param, INTRA, intra)
        setattr(param, INTER, inter)
    intra[0] += 1
    inter[0] = intra[0]
    return intra[1], inter[1]


@torch.no_grad()
def all_to_all_loco_quant_reduce(params, groups, loco_param=None, on_read=None):
    """Drop-in for DeepSpeed's ``all_to_all_loco_quant_reduce(params, groups, loco_param)``: this rank's
    mean-reduced partition of every ``param.grad``, in its own dtype, through qgZ's 4-bit stages with error feedback
    (tensors qgZ sends unquantized, see ``qgz.quantizes``, have no buffers); ``on_read``: as
    ``qgz.reduce_scatter``'s."""
    beta, keep, reset_t = parse_loco_param(loco_param)
    topology = qgz.topology()
    world, local_size = topology.world, topology.local_size
    gradients = [p.grad for p in params]
    feedbacks = []
    for param, gradient in zip(params, gradients):
        if not qgz.quantizes(gradient, world):
            feedbacks.append(None)
            continue
        intra, inter = _buffers(param, error_sizes(gradient.numel(), world, local_size), gradient.device, reset_t)
        feedbacks.append((Feedback(intra, beta, keep), None if local_size == 1 else Feedback(inter, beta, keep)))
    return qgz.reduce_scatter(gradients, groups, topology, feedbacks, on_read)
