"""A plain DeepSpeed training loop with ZeRO++ quantized weights in bf16; it does not import deepspeed_zeropp.

    DEEPSPEED_ZEROPP=1 deepspeed --num_gpus 2 examples/plain_deepspeed.py --deepspeed_config examples/ds_config_zeropp.json

On a machine without GPUs prefix DS_ACCELERATOR=cpu LOCAL_SIZE=2 (DeepSpeed's CPU accelerator, two ranks on this
host). Rank 0 ends with one line, ``RESULT {...}``: the per-step losses, the parameters' dtypes, whether the patch was
active.
"""
import argparse
import json
import warnings

import deepspeed
import torch


def main():
    # Deprecation notices of the collectives DeepSpeed calls, one per rank and call site: not this example's concern.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(2048, 257), torch.nn.LayerNorm(257), torch.nn.Flatten(),
                                torch.nn.Linear(257 * 8, 3)).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=args.deepspeed_config)
    generator = torch.Generator().manual_seed(engine.global_rank)
    losses, dtypes = [], set()
    for _ in range(args.steps):
        ids = torch.randint(0, 2048, (4, 8), generator=generator).to(engine.device)
        labels = torch.randint(0, 3, (4, ), generator=generator).to(engine.device)
        logits = engine(ids)
        dtypes.update(str(p.dtype) for p in engine.module.parameters())
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    if engine.global_rank == 0:
        print("RESULT " +
              json.dumps({
                  "losses": losses,
                  "dtypes": sorted(dtypes),
                  "zeropp_active": bool(getattr(CUDAQuantizer.quantize, "__deepspeed_zeropp__", False))
              }),
              flush=True)


if __name__ == "__main__":
    main()
