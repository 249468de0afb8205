"""The simulate command's arguments, and the one check every value gets before anything is built.

A value the command cannot run with stops it with one line naming the argument, the value and what is accepted
(exit 2): never a traceback from deep inside DeepSpeed or torch, nor a run that ends "not valid" minutes later for a
reason that was known at the start."""
from typing import NamedTuple, Optional

DEFAULT_MICRO_BATCH = 4
DEFAULT_BUDGET_MINUTES = 30.0
MODEL_FLAGS = ("layers", "width", "heads", "vocab", "seq")
SEARCH_CONFIGS = ("unquantized", "ours-qwz", "ours-qwz-qgz", "ours-qwz-qgz-hpz")  # --search without --configs


class ArgumentError(ValueError):
    """A value the command cannot run with; its text is the line the user reads."""


def add_arguments(parser):
    from .model import SHAPES
    from .runner import CONFIGS
    from .search import GRID
    parser.add_argument("--model", choices=sorted(SHAPES), default="gpt-1.4b", help="a named GPT shape")
    for flag in MODEL_FLAGS:
        parser.add_argument(f"--{flag}", type=int, help=f"GPT {flag} (overrides --model's)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--inter-gbps",
                        type=float,
                        nargs="*",
                        default=[100.0],
                        help="inter-node bandwidth per GPU (its own NIC; a ring across nodes sends through all of a "
                        "node's NICs), Gbit/s; several values: one run each")
    parser.add_argument("--inter-alpha-us", type=float, default=8.0, help="inter-node latency per ring hop, us")
    parser.add_argument("--intra-gbps", type=float, help="intra-node (NVLink) bandwidth per GPU, Gbit/s")
    parser.add_argument("--free", action="store_true", help="also measure with collectives free (host work only)")
    parser.add_argument("--configs",
                        nargs="+",
                        choices=list(CONFIGS),
                        help="configurations to measure (default: all; with --search: " + " ".join(SEARCH_CONFIGS) +
                        ", unquantized always among them)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per link and repetition")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro-batch",
                        type=int,
                        help=f"sequences per GPU (default: --deepspeed-config's train_micro_batch_size_per_gpu, "
                        f"else {DEFAULT_MICRO_BATCH})")
    parser.add_argument("--reuse-distance", type=int, help="DeepSpeed's stage3_max_reuse_distance")
    parser.add_argument("--deepspeed-config",
                        metavar="DS.JSON",
                        help="your DeepSpeed config: its zero_optimization sizes (HF \"auto\" resolved as the HF "
                        "Trainer does) are the baseline, instead of the HF Trainer's \"auto\" sizes")
    parser.add_argument("--search",
                        action="store_true",
                        help="search the zero_optimization sizes (coordinate descent over --grid) for each "
                        "configuration and unquantized ZeRO-3, and print the fastest block that fits the GPU's "
                        "memory; without it, one comparison at the baseline sizes")
    parser.add_argument(
        "--grid",
        nargs="+",
        metavar="KEY=V,V",
        help="with --search: the knobs to search and their values (numbers, or auto for the HF "
        "Trainer's), in this order; default: " +
        " ".join(f"{k.key}={','.join(f'{v:g}' if not isinstance(v, str) else v for v in k.values)}" if k.
                 values else f"{k.key}=(divisors>1 of --gpus-per-node)" for k in GRID))
    parser.add_argument("--budget-minutes",
                        type=float,
                        default=DEFAULT_BUDGET_MINUTES,
                        help="with --search: stop exploring where the next group of runs would not fit (default "
                        f"{DEFAULT_BUDGET_MINUTES:g})")
    parser.add_argument("--gpu-memory-gib",
                        type=float,
                        help="with --search: keep only settings whose peak memory fits (default: this GPU's "
                        "memory; on CPU, no limit)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled steps (kernel time, launches)")
    parser.add_argument("--json", help="also write every figure to this file (after every repetition)")


class Checked(NamedTuple):
    """What the arguments resolve to, once every one is checked."""
    shape: object  # model.Shape
    device: str
    micro_batch: int
    user: Optional[object]  # config.UserConfig
    keys: tuple
    grid: tuple  # (knob key, whole numbers, hpZ only), with --search
    memory_gb: Optional[float]


def check(args, has_cuda):
    """Every argument checked; raises ArgumentError naming the first value that cannot run."""
    from . import config, model
    from .runner import CONFIGS
    device = args.device if args.device != "auto" else ("cuda" if has_cuda() else "cpu")
    if device == "cuda" and not has_cuda():
        raise ArgumentError("--device cuda: no CUDA device here; accepted: cpu, or auto")
    for flag in ("reps", "steps", "gpus_per_node", "nodes", "micro_batch", *MODEL_FLAGS):
        _at_least(args, flag, 1)
    for flag in ("warmup", "reuse_distance"):
        _at_least(args, flag, 0)
    if args.gpus_per_node * args.nodes < 2:
        raise ArgumentError(f"--gpus-per-node {args.gpus_per_node} --nodes {args.nodes}: a world of "
                            f"{args.gpus_per_node * args.nodes} rank; accepted: 2 or more ranks (GPUs per node x "
                            "nodes)")
    base = model.SHAPES[args.model]
    shape = base._replace(**{f: getattr(args, f) for f in MODEL_FLAGS if getattr(args, f) is not None})
    if shape.width % shape.heads:
        raise ArgumentError(f"{_given(args, 'width', shape.width)} {_given(args, 'heads', shape.heads)}: the width "
                            "is split evenly over the attention heads; accepted: a --width that --heads divides")
    bad = [g for g in args.inter_gbps if g <= 0]
    if bad:
        raise ArgumentError(f"--inter-gbps {' '.join(f'{g:g}' for g in bad)}: accepted: link speeds > 0 Gbit/s")
    if args.intra_gbps is not None and args.intra_gbps <= 0:
        raise ArgumentError(f"--intra-gbps {args.intra_gbps:g}: accepted: a link speed > 0 Gbit/s")
    if args.inter_alpha_us < 0:
        raise ArgumentError(f"--inter-alpha-us {args.inter_alpha_us:g}: accepted: a latency >= 0 us")
    if device == "cuda" and not args.free and not args.inter_gbps:
        raise ArgumentError("--inter-gbps with no value: nothing to measure; accepted: one or more link speeds, "
                            "or --free")
    user = None
    if args.deepspeed_config is not None:
        try:
            user = config.read(args.deepspeed_config, shape.width)
        except ValueError as error:
            raise ArgumentError(f"--deepspeed-config {args.deepspeed_config}: {error}") from None
    micro = args.micro_batch or (user and user.micro_batch) or DEFAULT_MICRO_BATCH
    keys = tuple(args.configs or (SEARCH_CONFIGS if args.search else CONFIGS))
    if args.search and "unquantized" not in keys:
        keys = ("unquantized", ) + keys
    grid, memory = (), None
    if args.search:
        grid = _grid(args.grid, shape.width, args.gpus_per_node)
        if args.budget_minutes <= 0:
            raise ArgumentError(f"--budget-minutes {args.budget_minutes:g}: accepted: minutes > 0")
        memory = args.gpu_memory_gib
        if memory is not None and memory <= 0:
            raise ArgumentError(f"--gpu-memory-gib {memory:g}: accepted: GiB > 0")
        if memory is None and device == "cuda":
            import torch
            memory = torch.cuda.get_device_properties(0).total_memory / 2**30
    else:
        for flag, default in (("grid", None), ("gpu_memory_gib", None), ("budget_minutes", DEFAULT_BUDGET_MINUTES)):
            value = getattr(args, flag)
            if value != default:
                shown = " ".join(value) if isinstance(value, list) else f"{value:g}"
                raise ArgumentError(f"--{flag.replace('_', '-')} {shown}: accepted with --search only")
    return Checked(shape, device, micro, user, keys, grid, memory)


def _at_least(args, flag, minimum):
    value = getattr(args, flag)
    if value is not None and value < minimum:
        raise ArgumentError(f"--{flag.replace('_', '-')} {value}: accepted: an integer >= {minimum}")


def _given(args, flag, value):
    """``--flag value`` as the user gave it, or where the value came from."""
    return f"--{flag} {value}" if getattr(args, flag) is not None else f"--{flag} {value} (--model {args.model}'s)"


def _grid(items, width, gpus_per_node):
    """``--grid KEY=V,V ...`` (or the default grid) as (key, whole numbers, hpZ only) tuples."""
    from . import search
    knobs = search.GRID
    if items:
        knobs = []
        for item in items:
            key, _, text = item.partition("=")
            if key not in search.KNOBS:
                raise ArgumentError(f"--grid {item}: {key!r} is not a knob; accepted: " + ", ".join(search.KNOBS))
            try:
                numbers = tuple(v if v == "auto" else float(v) for v in text.split(",")) if text else ()
            except ValueError:
                raise ArgumentError(f"--grid {item}: accepted: KEY=V,V,... with numbers or auto") from None
            if any(v != "auto" and (v < 0 or not v.is_integer()) for v in numbers):
                raise ArgumentError(f"--grid {item}: accepted: whole numbers >= 0, or auto")
            if numbers and "auto" in numbers and key not in ("reduce_bucket_size", "stage3_prefetch_bucket_size"):
                raise ArgumentError(f"--grid {item}: auto is the HF Trainer's value of reduce_bucket_size and "
                                    "stage3_prefetch_bucket_size only; accepted here: numbers")
            knobs.append(search.KNOBS[key]._replace(values=numbers))
    grid = []
    for knob in knobs:
        numbers = search.values(knob, width, gpus_per_node)
        if knob.key == search.configs.HPZ:
            wrong = [n for n in numbers if n < 2 or gpus_per_node % n]
            if wrong:
                raise ArgumentError(f"--grid {knob.key}={','.join(map(str, wrong))}: accepted: divisors > 1 of "
                                    f"--gpus-per-node {gpus_per_node}")
        grid.append((knob.key, numbers, knob.hpz_only))
    return tuple(g for g in grid if g[1])
