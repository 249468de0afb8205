"""Seams where DeepSpeed saves and loads frozen parameters: a MixZ++ weight's fragment is its dequantized values
(what zero_to_fp32 reads), carrying its codes and scales so that loading restores them exactly."""
from ...formats.dtypes import SUPPORTED_DTYPES
from ..quantizer import QuantizerMethods
from .common import own_dtype, stored_quantized


def frozen_fragment(original):
    """Why this seam: save_checkpoint stores each frozen parameter's partition as its fragment in the model states
    file, which zero_to_fp32 concatenates; for MixZ++ that is int8 codes without their scales. This method hands
    over one parameter's fragment, so the dequantized partition can take its place.

    Seam factory for ``DeepSpeedEngine._get_param_fragment_func``: a MixZ++ weight's fragment in the model
    states file is its dequantized partition in its own dtype, what zero_to_fp32 and a forward read. Its codes
    and scales ride along as attributes (``ds_zeropp_codes``, ``ds_zeropp_scale``; pickled with the tensor,
    dropped by zero_to_fp32's concatenation) so that loading restores them exactly."""

    def wrapper(engine, param):
        fragment = original(engine, param)
        partition = getattr(param, "ds_tensor", None)
        if not stored_quantized(partition):
            return fragment
        values = QuantizerMethods.dequantize_partition(partition, own_dtype(param)).detach().cpu()
        values.ds_zeropp_codes = fragment
        values.ds_zeropp_scale = partition.ds_quant_scale.detach().cpu()
        return values

    return wrapper


def _restored_partition(partition, saved):
    """The MixZ++ partition for a saved frozen fragment: its own codes when it carries them, else (a checkpoint
    written without MixZ++) the saved values quantized."""
    codes = getattr(saved, "ds_zeropp_codes", None)
    if codes is None:
        return QuantizerMethods.quantize_partition(saved.to(partition.device), like=partition)
    scales = saved.ds_zeropp_scale.to(partition.device, copy=True)
    return QuantizerMethods.stored_partition(codes.to(partition.device, copy=True), scales, partition)


def load_frozen_fragments(original):
    """Why this seam: load_checkpoint copies the saved frozen fragments into the partitions here, floats into MixZ++'s
    int8 codes; the wrapper sees the checkpoint and every parameter, so it rebuilds those partitions from what was
    saved.

    Seam factory for ``DeepSpeedEngine.load_module_state_dict``: upstream copies each saved frozen fragment
    into ``param.ds_tensor``, which for a MixZ++ weight is int8 (floats truncated to 0 or +-1). Afterwards every
    MixZ++ partition whose float fragment was loaded is rebuilt from the checkpoint."""

    def wrapper(engine, checkpoint, *args, **kwargs):
        result = original(engine, checkpoint, *args, **kwargs)
        from deepspeed.checkpoint.constants import FROZEN_PARAM_FRAGMENTS
        fragments = checkpoint.get(FROZEN_PARAM_FRAGMENTS) or {}
        for param in engine.module.parameters():
            partition = getattr(param, "ds_tensor", None)
            saved = fragments.get(engine.param_names.get(param))
            if stored_quantized(partition) and saved is not None and saved.dtype in SUPPORTED_DTYPES:
                param.ds_tensor = _restored_partition(partition, saved)
        return result

    return wrapper
