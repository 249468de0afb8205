"""The DeepSpeed #7775 setup with the HF Trainer: BERT from a config, bf16, ZeRO-3 with zero_quantized_weights.

This script does not import deepspeed_zeropp. Run it with DEEPSPEED_ZEROPP=1 to have the patch applied:

    DEEPSPEED_ZEROPP=1 torchrun --nproc_per_node 2 examples/hf_trainer_bert.py --deepspeed examples/ds_config_zeropp.json

On a machine without GPUs prefix DS_ACCELERATOR=cpu LOCAL_SIZE=2 (DeepSpeed's CPU accelerator, two ranks on this
host). Without the variable, DeepSpeed up to 0.19.5 fails with "expected scalar type Half but found BFloat16", and
0.19.6+ with "...the number of weights be a multiple of 8". Rank 0 ends with one line, ``RESULT {...}``: the
per-step losses, the dtypes every parameter had in its module's forward, and whether the patch was active.
"""
import argparse
import json
import os
import warnings

import torch
from transformers import AutoModelForSequenceClassification, BertConfig, Trainer, TrainingArguments, set_seed


class RandomTokens(torch.utils.data.Dataset):

    def __init__(self, size=64, length=32, vocab=2048):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (size, length), generator=generator)
        self.labels = torch.randint(0, 2, (size, ), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class DtypeProbe(torch.nn.Module):
    """Records the dtype of every parameter each time its module runs (after ZeRO-3 has gathered it)."""

    def __init__(self, model):
        super().__init__()
        self.seen = set()
        for module in model.modules():
            module.register_forward_pre_hook(self.hook)

    def hook(self, module, inputs):
        self.seen.update(str(p.dtype) for p in module.parameters(recurse=False))


def main():
    # Deprecation notices of the collectives DeepSpeed calls, one per rank and call site: not this example's concern.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--output_dir", default="/tmp/hf_trainer_zeropp")
    args = parser.parse_args()
    training_args = TrainingArguments(output_dir=args.output_dir,
                                      deepspeed=args.deepspeed,
                                      bf16=True,
                                      per_device_train_batch_size=4,
                                      max_steps=args.steps,
                                      logging_steps=1,
                                      learning_rate=1e-4,
                                      report_to=[],
                                      save_strategy="no",
                                      seed=0,
                                      disable_tqdm=True,
                                      use_cpu=not torch.cuda.is_available())
    config = BertConfig(vocab_size=2049,
                        hidden_size=256,
                        num_hidden_layers=4,
                        num_attention_heads=4,
                        intermediate_size=1024,
                        max_position_embeddings=64,
                        num_labels=2)
    set_seed(0)  # the same initial weights on every run (the Trainer seeds only after the model exists)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.bfloat16)
    probe = DtypeProbe(model)
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    result = {
        "losses": losses,
        "dtypes_seen": sorted(probe.seen),
        "zeropp_active": bool(getattr(CUDAQuantizer.quantize, "__deepspeed_zeropp__", False))
    }
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result), flush=True)
    # End the process group before the interpreter does: its communication threads, left to interpreter teardown,
    # have aborted the process on exit ("terminate called without an active exception") after all work was done.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
