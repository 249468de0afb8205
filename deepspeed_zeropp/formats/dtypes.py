"""The dtypes the quantizer accepts, the one place that checks them, and their short names."""
import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The short names job specs, benchmark tables and test ids use, in the order of SUPPORTED_DTYPES.
BY_NAME = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_DEQUANT_DTYPE = torch.float16  # what DeepSpeed's dequantize returns when no dtype is asked for


def dtype_names(dtypes=SUPPORTED_DTYPES):
    return ", ".join(str(d) for d in dtypes)


def check_float_dtype(dtype, what):
    """Raise TypeError unless ``dtype`` is one the quantizer reads and writes natively."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{what} has dtype {dtype}; deepspeed_zeropp supports {dtype_names()}")


def check_wire_tensors(codes, scales):
    """Validate the (codes, scales) pair of the wire format: int8 codes, float32 scales of shape [G] or [G, 1]."""
    if codes.dtype != torch.int8:
        raise TypeError(f"quantized codes have dtype {codes.dtype}; expected torch.int8")
    if scales.dtype != torch.float32:
        raise TypeError(f"quantization scales have dtype {scales.dtype}; expected torch.float32")
    if scales.dim() == 2 and scales.shape[1] != 1 or scales.dim() > 2 or scales.numel() == 0:
        raise ValueError(f"quantization scales must have shape [G] or [G, 1] with G >= 1, got {tuple(scales.shape)}")
