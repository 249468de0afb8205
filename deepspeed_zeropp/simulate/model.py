"""The simulated job's model: a GPT in plain torch (no download, no transformers), and its token batches.

Pre-norm blocks of causal self-attention (torch's fused attention) and a 4x MLP, learned positions, an untied output
head: ``12 * layers * width**2 + 2 * vocab * width`` weights (24 x 2048: 1.42B; 32 x 4096: 6.9B).
"""
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F


class Shape(NamedTuple):
    layers: int
    width: int
    heads: int
    vocab: int = 50304  # GPT-2's, padded to a multiple of 64 (an odd one stops upstream's qgZ)
    seq: int = 1024

    @property
    def parameters(self):
        return 12 * self.layers * self.width**2 + 13 * self.layers * self.width + (2 * self.vocab + self.seq +
                                                                                   2) * self.width


SHAPES = {  # named shapes the benchmarks and the command line use
    "gpt-1.4b": Shape(24, 2048, 16),
    "gpt-7b": Shape(32, 4096, 32),
    "tiny": Shape(2, 64, 2, vocab=512, seq=32),
}


class Block(nn.Module):

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w)
        x = x + self.proj(attended)
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class GPT(nn.Module):

    def __init__(self, shape):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(shape.vocab, shape.width), nn.Embedding(shape.seq, shape.width)
        self.blocks = nn.ModuleList(Block(shape.width, shape.heads) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, shape.vocab, bias=False)

    def forward(self, input_ids, labels):
        x = self.tokens(input_ids) + self.positions(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def batch(shape, size, step, device):
    """Tokens to learn: each sequence counts up from a random start, so the loss falls within a few steps."""
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, shape.vocab, (size, 1), generator=generator)
    tokens = (start + torch.arange(shape.seq + 1)) % shape.vocab
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)
