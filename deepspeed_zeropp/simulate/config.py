"""The user's DeepSpeed config as the simulation's baseline: its ``zero_optimization`` bucket sizes (the HF Trainer's
"auto" values resolved as the Trainer resolves them for the model's width) and its micro-batch.

Every value is checked here, so that a config the simulation cannot use stops the command with one line naming the
key, before anything is built; a key the simulation does not model is kept, untouched, for the block it prints."""
import json
from typing import NamedTuple, Optional

# the zero_optimization sizes a simulated run applies (absent ones: DeepSpeed's defaults, as in the user's job)
BUCKETS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
           "stage3_max_live_parameters", "stage3_max_reuse_distance")
# the ZeRO++ switches: each configuration of runner.CONFIGS sets its own, whatever the user's config says
ZEROPP_FLAGS = ("zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients")
HPZ = "zero_hpz_partition_size"


def hf_auto(width):
    """The values the HF Trainer writes for "auto" (its DeepSpeed integration, for a model of hidden size ``width``);
    also what the simulation runs when the user gives no config, since it is what most users run."""
    return {
        "reduce_bucket_size": width * width,
        "stage3_prefetch_bucket_size": int(0.9 * width * width),
        "stage3_param_persistence_threshold": 10 * width,
    }


class UserConfig(NamedTuple):
    path: str
    buckets: dict  # BUCKETS keys the config sets, as whole numbers ("auto" resolved)
    micro_batch: Optional[int]  # train_micro_batch_size_per_gpu, when a number
    other: dict  # zero_optimization's keys the simulation does not model (offload, overlap_comm, ...)
    zeropp: dict  # the ZeRO++ keys it had (replaced by the configuration measured)


def read(path, width):
    """The config at ``path`` for a model of hidden size ``width``; ValueError saying what is wrong otherwise."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as error:
        raise ValueError(f"cannot be read ({error.strerror or error})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"is not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    if not isinstance(config, dict):
        raise ValueError(f"holds a JSON {type(config).__name__}; accepted: a JSON object (a DeepSpeed config)")
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        raise ValueError("has no zero_optimization object; accepted: a config with zero_optimization stage 3")
    if zero.get("stage") != 3 or isinstance(zero.get("stage"), bool):
        raise ValueError(f"zero_optimization.stage is {json.dumps(zero.get('stage'))}; accepted: 3 (ZeRO-3, the "
                         "stage ZeRO++ runs in)")
    auto = hf_auto(width)
    buckets = {}
    for key in BUCKETS:
        if key in zero:
            buckets[key] = _whole(f"zero_optimization.{key}", zero[key], auto.get(key), minimum=0)
    for key in ZEROPP_FLAGS:
        if key in zero and not isinstance(zero[key], bool):
            raise ValueError(f"zero_optimization.{key} is {json.dumps(zero[key])}; accepted: true or false")
    if HPZ in zero:
        _whole(f"zero_optimization.{HPZ}", zero[HPZ], None, minimum=1)
    micro = config.get("train_micro_batch_size_per_gpu")
    micro = None if micro in (None, "auto") else _whole("train_micro_batch_size_per_gpu", micro, None, minimum=1)
    known = set(BUCKETS) | set(ZEROPP_FLAGS) | {HPZ, "stage"}
    return UserConfig(path, buckets, micro, {
        k: v
        for k, v in zero.items() if k not in known
    }, {k: zero[k]
        for k in (*ZEROPP_FLAGS, HPZ) if k in zero})


def _whole(name, value, auto, minimum):
    """``value`` as a whole number >= ``minimum`` (JSON's 5e8 included); "auto" -> ``auto`` where the HF Trainer
    resolves the key."""
    if value == "auto" and auto is not None:
        return auto
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral or value < minimum:
        accepted = f"a whole number >= {minimum}" + (' or "auto"' if auto is not None else "")
        raise ValueError(f"{name} is {json.dumps(value)}; accepted: {accepted}")
    return int(value)
