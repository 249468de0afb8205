"""Engine teardown: leave nothing of a finished DeepSpeed engine reachable, so that the next engine built in the
same process starts where this one did (the demo's and the harness's runs, the simulated world's configurations).

It uses nothing of this package: its layer sits below every command that builds engines, which import it from
here rather than from one another.
"""
import torch


def release(engine):
    """Leave nothing of a finished engine reachable, so the next configuration starts where this one did.

    ``destroy`` removes ZeRO-3's hooks (autograd holds those on gradient accumulation in C++, out of the garbage
    collector's sight). Two process-wide references of DeepSpeed outlive it and keep every parameter and the
    optimizer through ``_z3_optimizer``: ``FWD_MODULE_STACK``, onto which each engine pushes its top module, and
    the parameter coordinator's class-level ``lru_cache`` of parameters to release."""
    import gc
    from deepspeed.runtime.zero import parameter_offload, partitioned_param_coordinator
    engine.destroy()
    own = {id(module) for module in engine.module.modules()}
    parameter_offload.FWD_MODULE_STACK[:] = [m for m in parameter_offload.FWD_MODULE_STACK if id(m) not in own]
    for cache in method_caches(partitioned_param_coordinator.PartitionedParameterCoordinator):
        cache.cache_clear()
    from deepspeed.utils import groups
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None  # hpZ's group, else adopted by every later engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def method_caches(cls):
    """The ``functools`` caches of ``cls``'s methods, also under wrappers without ``functools.wraps``."""
    for method in vars(cls).values():
        cells = getattr(method, "__closure__", None) or ()
        for candidate in (method, *(cell.cell_contents for cell in cells)):
            if hasattr(candidate, "cache_clear"):
                yield candidate
