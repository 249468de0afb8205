"""One rank of the demo: BERT in bf16 under ZeRO-3, each run of the spec trained for a few steps (rank 0 writes).

A run reports its per-step losses, the forward checks (the dtype of every parameter at every forward, and gathered
values against the originals before training) and ``counts``, calls through DeepSpeed's quantizer and gather handles,
which prove that quantization ran (checks.py). On CPU, DeepSpeed's compiled fp16 quantizer op does not exist: the
unpatched run uses ``upstream_op.UpstreamOpStandIn``, which reads and returns fp16 whatever the input's dtype, as the
real op does.
"""
import json
import os
import sys
import time
import traceback

import torch

from ..formats.dtypes import BY_NAME
from ..teardown import release
from .checks import Counters, ForwardChecks
from .upstream_op import install as install_stand_in

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
