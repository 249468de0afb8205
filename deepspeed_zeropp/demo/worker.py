"""One rank of the demo: BERT in bf16 under ZeRO-3, each run of the spec trained for a few steps (rank 0 writes).

A run reports its per-step losses, the forward checks (the dtype of every parameter at every forward, and gathered
values against the originals before training) and ``counts``, calls through DeepSpeed's quantizer and gather handles,
which prove that quantization ran. On CPU, DeepSpeed's compiled fp16 quantizer op does not exist: the unpatched run
uses :class:`UpstreamOpStandIn`, which reads and returns fp16 whatever the input's dtype, as the real op does.
"""
import json
import os
import sys
import time
import traceback

import torch

from ..backends import torch_ref
from ..formats.dtypes import BY_NAME
from ..formats.grouping import equal_groups

VOCAB = 2048  # word embeddings above 500k elements: large enough for quantize_nontrainable_params
SEQ = 32


def bert(dtype, layers=4, hidden=256):
    """DeepSpeed's bf16 crash report's shape: BertForSequenceClassification from a BertConfig. With hidden 256 and
    vocabulary VOCAB + 1 = 2049 several partitions at 2 ranks are not multiples of 8 (257 and others): upstream
    asserts on them."""
    try:
        from transformers import BertConfig, BertForSequenceClassification
    except ImportError as error:
        raise ImportError("the demo's model needs transformers: pip install 'deepspeed_zeropp[demo]'") from error
    config = BertConfig(vocab_size=VOCAB + 1,
                        hidden_size=hidden,
                        num_hidden_layers=layers,
                        num_attention_heads=4,
                        intermediate_size=4 * hidden,
                        max_position_embeddings=64,
                        num_labels=2)
    return BertForSequenceClassification(config).to(dtype)


def bert_batch(step, rank, batch_size=4):
    """The same batch for the same (step, rank) in every run, quantized or not."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    input_ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=generator)
    labels = torch.randint(0, 2, (batch_size, ), generator=generator)
    return {"input_ids": input_ids, "labels": labels}


class UpstreamOpStandIn:
    """DeepSpeed's compiled int8 quantizer op on CPU, dtype behaviour included: it reads its input buffer as fp16
    bits whatever the dtype and always returns fp16. One deliberate difference: scales come back 1-D, because gloo
    cannot all-gather the op's [G, 1] scales and would fail before the dtype bug shows."""
    Symmetric = 0
    Asymmetric = 1

    @staticmethod
    def as_fp16(x, groups):
        """The op's reading of any input: its first 2 * numel bytes as fp16."""
        as_fp16 = x.contiguous().view(-1).view(torch.uint8)[:2 * x.numel()].view(torch.float16)
        if as_fp16.numel() % groups != 0:
            raise RuntimeError(f"stand-in op: {as_fp16.numel()} elements in {groups} groups")
        return as_fp16

    @classmethod
    def quantize(cls, x, groups, num_bits, quant_type):
        codes, scales = torch_ref.quantize(cls.as_fp16(x, groups), groups)
        return codes.view(x.shape), scales

    @staticmethod
    def dequantize(codes, scales, groups, num_bits, quant_type):
        return torch_ref.dequantize(codes.view(-1), scales.view(-1), equal_groups(codes.numel() // groups),
                                    torch.float16).view(codes.shape)


def install_stand_in(op=UpstreamOpStandIn):
    """Make DeepSpeed's ``CUDAQuantizer`` use ``op`` instead of building the CUDA op."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    CUDAQuantizer.quantizer_cuda_module = op()


def ds_config(quantized, dtype, batch_size=4):
    return {
        "train_micro_batch_size_per_gpu": batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,  # every parameter is gathered, so every one is quantized
            "reduce_bucket_size": 2**22,  # DeepSpeed's default (5e8 elements) is far larger than the model
            "zero_quantized_weights": quantized,
        },
        "bf16": {
            "enabled": dtype == torch.bfloat16
        },
        "fp16": {
            "enabled": dtype == torch.float16
        },
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # a torch AdamW, also with the optimizer offloaded (the harness)
        "steps_per_print": 10**9,
    }


class Counters:
    """Counts calls through DeepSpeed's quantizer and gather handles without changing what they do."""

    def __init__(self):
        self.counts = {}
        self._restore = []

    def spy(self, owner, attr, key, when=lambda *a, **k: True):
        original = owner.__dict__[attr]

        def counting(*args, **kwargs):
            if when(*args, **kwargs):
                self.counts[key] = self.counts.get(key, 0) + 1
            return original(*args, **kwargs)

        setattr(owner, attr, counting)
        self._restore.append((owner, attr, original))

    def install(self):
        from deepspeed.runtime.zero import partition_parameters as pp
        self.spy(pp.CUDAQuantizer, "quantize", "quantize")
        self.spy(pp.CUDAQuantizer, "dequantize", "dequantize")
        self.spy(pp.AllGatherHandle, "wait", "quantized_single_gathers",
                 lambda h, *a, **k: getattr(h, "_AllGatherHandle__quantization", None) is not None)
        self.spy(pp.AllGatherCoalescedHandle, "wait", "quantized_bucket_gathers",
                 lambda h, *a, **k: getattr(h, "quantization", None) is not None)

    def remove(self):
        for owner, attr, original in reversed(self._restore):
            setattr(owner, attr, original)


class ForwardChecks:
    """At every module forward (after ZeRO-3 gathered its parameters): dtype kept, and values still equal to
    the originals within the int8 bound wherever they cannot have been trained yet (frozen, or before step 1)."""

    def __init__(self, model, originals=None):
        """``originals``: full values by parameter, for models already partitioned at construction. Without a
        model nothing is expected (step-time runs: no full-precision copy of a model that may fill the device)."""
        originals = originals or {}
        self.expected = {
            p: (n, p.dtype, originals.get(p, p).detach().float().clone(), p.requires_grad)
            for n, p in (model.named_parameters() if model is not None else ())
        }
        self.checks = 0
        self.dtype_errors = []
        self.value_errors = []
        self.max_rel_error = 0.0
        self.trained = False
        self.largest = max((original.abs().max().item() for _, _, original, _ in self.expected.values()), default=0.0)

    def hook(self, module, inputs):
        for param in module.parameters(recurse=False):
            name, dtype, original, trainable = self.expected[param]
            self.checks += 1
            if param.dtype != dtype:
                self.dtype_errors.append(f"{name}: {param.dtype} (expected {dtype})")
            elif (not trainable or not self.trained) and param.numel() == original.numel():
                self.compare(name, param.detach().float().view(original.shape), original)

    def compare(self, name, gathered, original):
        """A coalesced bucket quantizes groups that span neighbouring parameters, so a group's absmax can come
        from the largest parameter in the model: one int8 step of that (absmax/128; +absmax itself clamps from
        code 128 to 127), plus the dtype's rounding, bounds the error. Garbage (bits misread, uninitialised
        buffers) is off by the values' own size."""
        error = (gathered - original.to(gathered.device)).abs().max().item()
        own = original.abs().max().item() or 1.0
        self.max_rel_error = max(self.max_rel_error, error / own)
        if not error <= self.largest / 128 + own * 2**-8:
            self.value_errors.append(f"{name}: max error {error:.3g} (absmax {own:.3g})")

    def attach(self, model):
        for module in model.modules():
            module.register_forward_pre_hook(self.hook)


def train_step(engine, batch):
    """One optimizer step; returns the loss averaged over ranks and the step's wall time in ms."""
    batch = {k: v.to(engine.device) for k, v in batch.items()}
    start = time.perf_counter()
    loss = engine(**batch)["loss"]
    engine.backward(loss)
    engine.step()
    mean = loss.detach().float().clone()
    torch.distributed.all_reduce(mean)  # also waits for the step to finish on every rank
    return mean.item() / torch.distributed.get_world_size(), (time.perf_counter() - start) * 1000


def train(spec, run, rank):
    import deepspeed
    from ..simulate.runner import release
    dtype = BY_NAME[spec["dtype"]]
    torch.manual_seed(spec.get("seed", 0))
    model = bert(dtype)
    checks = ForwardChecks(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model,
                                      optimizer=optimizer,
                                      config=ds_config(run.get("quantized", False), dtype))
    checks.attach(engine.module)
    counters = Counters()
    counters.install()
    losses = []
    try:
        for step in range(spec.get("steps", 5)):
            losses.append(train_step(engine, bert_batch(step, rank))[0])
            checks.trained = True
    finally:
        counters.remove()
    release(engine)
    return {
        "losses": losses,
        "forward_checks": checks.checks,
        "dtype_errors": checks.dtype_errors[:10],
        "value_errors": checks.value_errors[:10],
        "counts": counters.counts,
    }


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    rank = int(os.environ["RANK"])
    # Deterministic mode also fills torch.empty() with NaN, so reads of uninitialised memory show up every time
    # instead of depending on what the allocator happened to hand out.
    torch.use_deterministic_algorithms(True, warn_only=True)
    if spec.get("patch"):
        import deepspeed_zeropp
        deepspeed_zeropp.patch()
    if spec["device"] == "cpu":
        install_stand_in()
    import deepspeed
    if spec["device"].startswith("cuda"):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if spec["device"] == "cuda-shared":
        # DeepSpeed (0.19.8) binds the default group to the rank's GPU, after which torch 2.11 builds every new
        # group by splitting the default one, which gloo cannot do. An unbound gloo group, set up first, is the one
        # DeepSpeed then uses.
        torch.distributed.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="gloo")
    results = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "runs": {}}
    for run in spec["runs"]:
        try:
            results["runs"][run["name"]] = train(spec, run, rank)
        except Exception as error:  # recorded, not hidden: the demo prints it
            results["runs"][run["name"]] = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()[-3000:]
            }
            break  # ranks may now disagree on collectives; stop here
    if rank == 0:
        with open(spec["out"] + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(spec["out"] + ".tmp", spec["out"])


if __name__ == "__main__":
    main(sys.argv[1])
    # Skip interpreter teardown: with DeepSpeed 0.14.x on CPU it sometimes aborts in a C++ destructor
    # ("terminate called without an active exception") after all the work is done and reported.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
