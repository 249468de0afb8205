"""Models the harness trains, built from configs (no downloads), and their synthetic batches."""
import torch

from deepspeed_zeropp.demo.worker import SEQ, VOCAB, bert, bert_batch


class MixedLinear(torch.nn.Module):
    """A trainable fp32 weight and a frozen bf16 gate (with its frozen bias) in one module: ZeRO-3 fetches the
    three in one coalesced bucket, which the quantized path concatenates regardless of dtype, and MixZ++ fetches
    the two frozen ones in a bucket of stored codes. (DeepSpeed's optimizer wants one dtype among trainable
    parameters, hence the frozen bf16 ones.)"""

    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, width) / width**0.5)
        self.gate = torch.nn.Parameter(torch.randn(width, width, dtype=torch.bfloat16) / width**0.5,
                                       requires_grad=False)
        self.gate_bias = torch.nn.Parameter(torch.randn(width, dtype=torch.bfloat16) / width**0.5, requires_grad=False)

    def forward(self, x):
        return x @ self.weight.t() + (x.to(self.gate.dtype) @ self.gate.t() + self.gate_bias).to(x.dtype)


class MixedMLP(torch.nn.Module):
    """Odd sizes on purpose: at 2 ranks the 131 x 131 weights (and the head) have padded partitions, and such a
    partition (8581 elements) is prime and larger than one quantization group, so its groups end in a shorter one."""

    def __init__(self, width=131):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.mixed = MixedLinear(width)
        self.head = torch.nn.Linear(width, 3)

    def forward(self, input_ids, labels):
        hidden = torch.relu(self.mixed(self.embed(input_ids).mean(dim=1)))
        return {"loss": torch.nn.functional.cross_entropy(self.head(hidden), labels)}


def gpt2(dtype):
    """GPT-2 small's shape (12 layers, width 768, vocab 50257) from a config, for GPU runs."""
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_positions=GPT2_SEQ)).to(dtype)


def gpt(dtype, layers=24, width=2048, heads=16, seq=512, vocab=50304):
    """A GPT-2-architecture model of any size from a config, without dropout; the defaults make 1.3B parameters,
    for step times that the GPU, not the host, bounds. The vocabulary is GPT-2's padded to a multiple of 64, as
    is usual for speed; an odd one would also stop upstream's qgZ, whose one scale per embedding row cannot be
    split over 2 nodes. Embeddings get GPT-2's initial scale (std 0.02) also when built under zero.Init, where the
    library's own initialisation after construction sees empty partitions."""
    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=vocab,
                        n_layer=layers,
                        n_embd=width,
                        n_head=heads,
                        n_positions=seq,
                        resid_pdrop=0.0,
                        embd_pdrop=0.0,
                        attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).to(dtype)
    for embedding in (model.transformer.wte, model.transformer.wpe):
        with deepspeed.zero.GatheredParameters([embedding.weight], modifier_rank=0):  # a no-op when not partitioned
            torch.nn.init.normal_(embedding.weight, std=config.initializer_range)
    return model


def llama_lora(dtype):
    """A small Llama-architecture model from a LlamaConfig with PEFT LoRA adapters on q/v projections: the
    base is ``dtype`` and frozen by PEFT, the adapters keep PEFT's default dtype (fp32)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=VOCAB,
                         hidden_size=128,
                         intermediate_size=344,
                         num_hidden_layers=2,
                         num_attention_heads=4,
                         num_key_value_heads=2,
                         max_position_embeddings=2 * SEQ)
    base = LlamaForCausalLM(config).to(dtype)
    return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))


def gpt2_bytes(dtype):
    """GPT-2 small's shape over byte tokens (vocab 256), for convergence runs on real text (:func:`corpus`)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=GPT2_SEQ)).to(dtype)


_corpus = None


def corpus():
    """Real text available offline on every machine: the Python standard library's own sources, in sorted path
    order, as one uint8 tensor (byte-level tokens). Returns (tokens, number of files)."""
    global _corpus
    if _corpus is None:
        import pathlib
        import sysconfig
        files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
        files = [f for f in files if not {"test", "tests", "site-packages", "dist-packages"} & set(f.parts)]
        text = b"".join(f.read_bytes() for f in files)
        _corpus = (torch.frombuffer(bytearray(text), dtype=torch.uint8), len(files))
    return _corpus


GPT2_SEQ = 256
BUILDERS = {
    "bert": bert,
    "mixed": lambda dtype: MixedMLP(),
    "padded": lambda dtype: MixedMLP().to(dtype),  # MixedMLP's padded partitions, one dtype throughout
    "gpt2": gpt2,
    "gpt": gpt,
    "gpt2_bytes": gpt2_bytes,
    "llama_lora": llama_lora
}
CAUSAL_LM = {"gpt2": (50257, GPT2_SEQ), "gpt": (50304, 512), "llama_lora": (VOCAB, SEQ)}


def build(name, dtype, **options):
    """``options``: the builder's own size arguments (``gpt`` only)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(BUILDERS)}")
    return BUILDERS[name](dtype, **options)


def batch(model, step, rank, batch_size=4, **options):
    """The same batch for the same (model, step, rank) in every run, quantized or not; ``options`` as for
    :func:`build` (``vocab`` and ``seq`` there set the token range and sequence length here)."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    if model == "gpt2_bytes":  # random windows of the corpus
        tokens, _ = corpus()
        starts = torch.randint(0, tokens.numel() - GPT2_SEQ, (batch_size, ), generator=generator)
        input_ids = torch.stack([tokens[s:s + GPT2_SEQ] for s in starts.tolist()]).long()
        return {"input_ids": input_ids, "labels": input_ids}
    if model in CAUSAL_LM:  # arithmetic progressions of token ids: learnable, so the loss falls
        vocab, seq = CAUSAL_LM[model]
        vocab, seq = options.get("vocab", vocab), options.get("seq", seq)
        start = torch.randint(0, vocab, (batch_size, 1), generator=generator)
        stride = torch.randint(1, 64, (batch_size, 1), generator=generator)
        input_ids = (start + stride * torch.arange(seq)) % vocab
        return {"input_ids": input_ids, "labels": input_ids}
    return bert_batch(step, rank, batch_size)  # BERT's, and the MLPs' (the same token range)
