"""Which DeepSpeed objects the patch replaces, on which releases, and why: the version-site table, as data.

A row names an attribute of a class in a DeepSpeed module, the releases that carry it (``since`` inclusive,
``until`` inclusive, None for open), the seam factory that wraps it, and why it is patched. On a release inside
a row's range the attribute must exist; ``patch(strict=True)`` raises otherwise.
"""
from typing import Callable, NamedTuple, Optional

from .quantizer import QuantizerMethods
from .seams import checkpoints, gathers, launcher, partitions, replacements

PARTITION_PARAMETERS = "deepspeed.runtime.zero.partition_parameters"
STAGE3 = "deepspeed.runtime.zero.stage3"
COALESCED_COLLECTIVES = "deepspeed.runtime.comm.coalesced_collectives"
PARAMETER_OFFLOAD = "deepspeed.runtime.zero.parameter_offload"
ENGINE = "deepspeed.runtime.engine"
MULTINODE_RUNNER = "deepspeed.launcher.multinode_runner"
UPSTREAM_DTYPE_FIX = "0.19.6"  # upstream's dtype fix: fp16 detour in the quantizer, dtype= at five sites
LOCO_SINCE, LOCO_UNTIL = "0.16.2", "0.19.7"  # zeropp_loco_param: all_to_all_loco_quant_reduce (0.19.8 removed it)

OLDEST_SUPPORTED = "0.14.4"
NEWEST_KNOWN = "0.19.8"


class Site(NamedTuple):
    owner: Optional[str]  # class name in ``module``; None for a module-level function
    attr: str
    factory: Callable  # original -> replacement
    why: str
    since: Optional[str] = None
    until: Optional[str] = None
    upstream_fixed_in: Optional[str] = None  # release from which upstream handles dtypes here (by fp16 detour)
    module: str = PARTITION_PARAMETERS
    adds: bool = False  # the attribute may be absent upstream: the patch adds it (and unpatch removes it)

    @property
    def name(self):
        return f"{self.owner or self.module.rsplit('.', 1)[1]}.{self.attr}"


SITES = (
    Site("CUDAQuantizer", "__init__", replacements.QUANTIZER_INIT, QuantizerMethods.__init__.__doc__),
    Site("CUDAQuantizer",
         "quantize",
         replacements.QUANTIZE,
         QuantizerMethods.quantize.__doc__,
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("CUDAQuantizer",
         "dequantize",
         replacements.DEQUANTIZE,
         QuantizerMethods.dequantize.__doc__,
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("AllGatherHandle",
         "wait",
         gathers.SINGLE_GATHER,
         "Why this seam: AllGatherHandle.wait dequantizes one gathered parameter; before 0.19.6 without a dtype "
         "(fp16 back), and for padded partitions with the wrong scale-to-element mapping. Wrapping wait reaches "
         "the handle after the all-gather, where the parameter and its gathered buffer are both known.",
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site(
        "AllGatherCoalescedHandle", "wait", gathers.BUCKET_GATHER,
        "Why this seam: AllGatherCoalescedHandle.wait dequantizes a whole bucket, possibly of mixed dtypes, "
        "without a dtype on every release (slices stay fp16 before 0.17.2). Dequantizing in the bucket's "
        "common dtype (fp32 when mixed) and casting each slice once keeps every dtype and its precision."),
    Site(None,
         "_dist_allgather_fn",
         gathers.FETCH_ALLGATHER,
         "Why this seam: every fetch closure (bucket, single parameter, hpZ secondary) sends a quantized fetch as "
         "two all-gathers through this function, the codes and then the scales: twice the collectives of an "
         "unquantized fetch. Our quantizer returns both as views of one packet per rank and our handle seams "
         "read packets, so the codes' call sends the whole packet and the scales' call sends nothing. The "
         "closures are local functions; this module-level function is what they all call by name.",
         module=PARTITION_PARAMETERS),
    Site("NoGatherHandle",
         "__init__",
         gathers.NO_GATHER,
         "Why this seam: NoGatherHandle.__init__ dequantizes a stored int8 (MixZ++) partition when the partition "
         "group has one rank; before 0.19.6 it hands back fp16.",
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("NoGatherCoalescedHandle",
         "__init__",
         gathers.NO_GATHER_COALESCED,
         "Why this seam: NoGatherCoalescedHandle.__init__, as NoGatherHandle.__init__, for a list of parameters.",
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("Init",
         "_allgather_params_coalesced",
         gathers.INIT_GATHER_COALESCED,
         "Why this seam: Init's own coalesced all-gather (GatheredParameters with hierarchy) dequantizes each "
         "parameter without a dtype before 0.19.6, and up to 0.19.5 reads every buffer of its list after waiting "
         "on the last all-gather only; the wrapper knows the list of parameters it fills.",
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("Init",
         "_allgather_params",
         gathers.INIT_GATHER_SINGLE,
         "Why this seam: Init's sequential all-gather dequantizes without a dtype, and its quantized branch never "
         "fires (it looks for ds_quant_scale on the parameter, not its partition); renamed in 0.18.5.",
         until="0.18.4"),
    Site("Init",
         "_allgather_params_sequential",
         gathers.INIT_GATHER_SEQUENTIAL,
         "Why this seam: Init's sequential all-gather (the 0.18.5+ name of _allgather_params).",
         since="0.18.5",
         upstream_fixed_in=UPSTREAM_DTYPE_FIX),
    Site("Init",
         "quantizer_module",
         replacements.class_quantizer,
         "Why this seam: the NoGather handles read Init.quantizer_module from the class, which upstream never "
         "assigns (AttributeError with MixZ++ at partition world size 1, or after zero.Init() without a config).",
         adds=True),
    Site(
        "Init", "_partition_param", partitions.partition_seam("ds_tensor"),
        "Why this seam: with MixZ++, _partition_param quantizes the freshly allocated (empty) partition and then "
        "copies the float values into the int8 result: frozen weights become garbage. Quantization is deferred "
        "until the partition holds its values. It also leaves the last rank's padding uninitialised, which qwZ "
        "then quantizes along with real values: the padding is zeroed."),
    Site(
        "Init", "_partition_param_sec", partitions.partition_seam("ds_secondary_tensor"),
        "Why this seam: the hpZ secondary partition has the same quantize-before-copy defect as _partition_param "
        "(and, before 0.19.8, the same uninitialised padding)."),
    Site("DeepSpeedZeroOptimizer_Stage3",
         "quantize_nontrainable_params",
         partitions.nontrainable_seam,
         "Why this seam: upstream asserts that frozen partitions are fp16 before quantizing them, "
         "so MixZ++ after freezing (LoRA) is impossible in bf16/fp32; the whole body is that assert plus the "
         "quantization, so it is reimplemented on our quantizer (with MixZ++ off, upstream's method runs).",
         module=STAGE3),
    Site("DeepSpeedZeRoOffload",
         "_convert_to_zero_parameters",
         partitions.engine_padding,
         "Why this seam: a model built under zero.Init() without a config was partitioned by an Init that knew "
         "of no quantization, leaving the last rank's padding uninitialised; the engine's config may still turn "
         "qwZ on for every gather. This is the first engine step that knows the flags and sees every partition.",
         module=PARAMETER_OFFLOAD),
    Site("DeepSpeedEngine",
         "_get_param_fragment_func",
         checkpoints.frozen_fragment,
         "Why this seam: save_checkpoint stores each frozen parameter's partition as its fragment in the model "
         "states file, which zero_to_fp32 concatenates; for MixZ++ that is int8 codes without their scales. This "
         "method hands over one parameter's fragment, so the dequantized partition can take its place.",
         module=ENGINE),
    Site("DeepSpeedEngine",
         "load_module_state_dict",
         checkpoints.load_frozen_fragments,
         "Why this seam: load_checkpoint copies the saved frozen fragments into the partitions here, floats into "
         "MixZ++'s int8 codes; the wrapper sees the checkpoint and every parameter, so it rebuilds those "
         "partitions from what was saved.",
         module=ENGINE),
    Site(None,
         "all_to_all_quant_reduce",
         replacements.QUANT_REDUCE,
         "Why this seam: qgZ's all_to_all_quant_reduce reads bf16/fp32 gradients as fp16 bits, sums partials in "
         "fp16 and casts back; the whole function is that kernel pipeline, so it is reimplemented (same "
         "signature, same 4-bit two-stage all-to-all) with native dtypes and fp32 sums.",
         module=COALESCED_COLLECTIVES),
    Site(None,
         "all_to_all_quant_reduce",
         replacements.QUANT_REDUCE,
         "Why this seam: stage3 binds all_to_all_quant_reduce by name at import; this is the binding it calls.",
         module=STAGE3),
    Site(None,
         "all_to_all_loco_quant_reduce",
         replacements.LOCO_QUANT_REDUCE,
         "Why this seam: LoCo's all_to_all_loco_quant_reduce (qgZ with error feedback, zeropp_loco_param) reads "
         "bf16/fp32 gradients and its error buffers as fp16 bits; the whole function is that kernel pipeline, so "
         "it is reimplemented (same signature and error-buffer attributes) on our qgZ with fp32 error feedback.",
         since=LOCO_SINCE,
         until=LOCO_UNTIL,
         module=COALESCED_COLLECTIVES),
    Site(None,
         "all_to_all_loco_quant_reduce",
         replacements.LOCO_QUANT_REDUCE,
         "Why this seam: stage3 binds all_to_all_loco_quant_reduce by name at import; this is the binding it calls.",
         since=LOCO_SINCE,
         until=LOCO_UNTIL,
         module=STAGE3),
    Site("MultiNodeRunner",
         "__init__",
         launcher.forward_variables,
         "Why this seam: DeepSpeed's multi-node launcher (deepspeed --hostfile) starts the other nodes' ranks "
         "through a runner (pdsh, OpenMPI, MVAPICH, Slurm, Intel MPI, MPICH) that forwards only the variables "
         "with its export prefixes and the lines of .deepspeed_env, so DEEPSPEED_ZEROPP=1 would patch the "
         "launching node's ranks alone. Every runner sets up its exports in this base constructor, and every "
         "runner's command is built from them: the wrapper adds the DEEPSPEED_ZEROPP* variables of the launcher's "
         "environment there, before the launcher's own exports and .deepspeed_env (a value given there wins).",
         module=MULTINODE_RUNNER),
)
