"""Which DeepSpeed objects the patch replaces, on which releases, and why: the version-site table, as data.

A row names an attribute of a class in a DeepSpeed module, the releases that carry it (``since`` inclusive,
``until`` inclusive, None for open) and the seam factory that wraps it, whose docstring (the one place it is written)
says why it is patched: the row's ``why``, the installed wrapper's docstring. On a release inside a row's range the
attribute must exist; ``patch(strict=True)`` raises otherwise.
"""
from typing import Callable, NamedTuple, Optional

from .seams import buckets, checkpoints, fetch, gathers, launcher, partitions, replacements, secondary

PARTITION_PARAMETERS = "deepspeed.runtime.zero.partition_parameters"
STAGE3 = "deepspeed.runtime.zero.stage3"
COALESCED_COLLECTIVES = "deepspeed.runtime.comm.coalesced_collectives"
PARAMETER_OFFLOAD = "deepspeed.runtime.zero.parameter_offload"
COORDINATOR = "deepspeed.runtime.zero.partitioned_param_coordinator"
ENGINE = "deepspeed.runtime.engine"
MULTINODE_RUNNER = "deepspeed.launcher.multinode_runner"
UPSTREAM_DTYPE_FIX = "0.19.6"  # upstream's dtype fix: fp16 detour in the quantizer, dtype= at five sites
LOCO_SINCE, LOCO_UNTIL = "0.16.2", "0.19.7"  # zeropp_loco_param: all_to_all_loco_quant_reduce (0.19.8 removed it)

OLDEST_SUPPORTED = "0.14.4"
NEWEST_KNOWN = "0.19.8"


class Site(NamedTuple):
    owner: Optional[str]  # class name in ``module``; None for a module-level function
    attr: str
    factory: Callable  # original -> replacement; its docstring says why this seam
    since: Optional[str] = None
    until: Optional[str] = None
    upstream_fixed_in: Optional[str] = None  # release from which upstream handles dtypes here (by fp16 detour)
    module: str = PARTITION_PARAMETERS
    adds: bool = False  # the attribute may be absent upstream: the patch adds it (and unpatch removes it)

    @property
    def why(self):
        return self.factory.__doc__

    @property
    def name(self):
        return f"{self.owner or self.module.rsplit('.', 1)[1]}.{self.attr}"


SITES = (
    Site("CUDAQuantizer", "__init__", replacements.quantizer_init),
    Site("CUDAQuantizer", "quantize", replacements.quantizer_quantize, upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("CUDAQuantizer", "dequantize", replacements.quantizer_dequantize, upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("AllGatherHandle", "wait", gathers.single_gather, upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("AllGatherCoalescedHandle", "wait", gathers.bucket_gather),
    Site(None, "_dist_allgather_fn", fetch.fetch_allgather, module=PARTITION_PARAMETERS),
    Site("NoGatherHandle", "__init__", gathers.no_gather, upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("NoGatherCoalescedHandle", "__init__", gathers.no_gather_coalesced, upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("Init", "_allgather_params_coalesced", gathers.init_gather_coalesced, upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("Init", "_allgather_params", gathers.init_gather_single, until="0.18.4"),
    Site("Init",
         "_allgather_params_sequential",
         gathers.init_gather_sequential,
         since="0.18.5",
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("Init", "quantizer_module", replacements.class_quantizer, adds=True),
    Site("Init", "_partition_param", partitions.partition_param),
    Site("Init", "_partition_param_sec", partitions.partition_param_sec),
    Site("PartitionedParameterCoordinator",
         "_PartitionedParameterCoordinator__all_gather_params",
         secondary.coordinator_fetch,
         module=COORDINATOR),
    Site("DeepSpeedZeroOptimizer_Stage3", "quantize_nontrainable_params", partitions.nontrainable_seam, module=STAGE3),
    Site("DeepSpeedZeroOptimizer_Stage3", "step", secondary.optimizer_step, module=STAGE3),
    Site("DeepSpeedZeroOptimizer_Stage3",
         "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads",
         buckets.reduce_bucket,
         module=STAGE3),
    Site("DeepSpeedZeroOptimizer_Stage3",
         "independent_gradient_partition_epilogue",
         buckets.gradients_epilogue,
         module=STAGE3),
    Site("DeepSpeedZeRoOffload", "_convert_to_zero_parameters", partitions.engine_padding, module=PARAMETER_OFFLOAD),
    Site("DeepSpeedEngine", "_get_param_fragment_func", checkpoints.frozen_fragment, module=ENGINE),
    Site("DeepSpeedEngine", "load_module_state_dict", checkpoints.load_frozen_fragments, module=ENGINE),
    Site("DeepSpeedEngine", "forward", fetch.forward_pass, module=ENGINE),
    Site("DeepSpeedEngine", "backward", fetch.backward_pass, module=ENGINE),
    Site(None, "all_to_all_quant_reduce", replacements.quant_reduce, module=COALESCED_COLLECTIVES),
    Site(None, "all_to_all_quant_reduce", replacements.stage3_quant_reduce, module=STAGE3),
    Site(None,
         "all_to_all_loco_quant_reduce",
         replacements.loco_quant_reduce,
         since=LOCO_SINCE,
         until=LOCO_UNTIL,
         module=COALESCED_COLLECTIVES),
    Site(None,
         "all_to_all_loco_quant_reduce",
         replacements.stage3_loco_quant_reduce,
         since=LOCO_SINCE,
         until=LOCO_UNTIL,
         module=STAGE3),
    Site("MultiNodeRunner", "__init__", launcher.forward_variables, module=MULTINODE_RUNNER),
)

# Rows named elsewhere, as ``patch(exclude=...)`` takes them (a row's ``name``)
FETCH_SITE = fetch.FETCH_SITE  # the fetch's one all-gather of codes and scales (packets)
# Init's coalesced gather: also the persistent parameters' one all-gather a step
INIT_COALESCED_SITE = next(site.name for site in SITES if site.factory is gathers.init_gather_coalesced)
# The optimizer step: hpZ's secondary partitions left unwritten inside it
STEP_SITE = next(site.name for site in SITES if site.factory is secondary.optimizer_step)
# A gradient bucket's reduce: the next bucket on the other of two streams once qgZ has read this one's gradients
BUCKET_SITE = next(site.name for site in SITES if site.factory is buckets.reduce_bucket)
