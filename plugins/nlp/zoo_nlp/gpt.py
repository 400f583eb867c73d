"""A small GPT: byte tokens (batch, seq) -> next-byte logits (batch, seq, 256).

Follows Karpathy's nanoGPT `model.py` (itself GPT-2, Radford et al. 2019): learned
absolute positions, pre-LayerNorm blocks of causal self-attention and a GELU MLP,
a final LayerNorm, and the output projection tied to the token embedding (Press &
Wolf 2017). Residual projections start scaled by 1/sqrt(2 * layers), as in GPT-2, so
the residual stream's variance does not grow with depth at initialization.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from zoo.errors import InputError


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)  # query, key and value in one matmul
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 256, context: int = 128, width: int = 128, layers: int = 4,
                 heads: int = 4) -> None:
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.grad_checkpointing = False
        self.apply(_init_gpt)
        for block in self.blocks:
            for proj in (block.attn.proj, block.proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.context:
            raise InputError(f"{t} tokens exceed the context of {self.context}")
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied: logits against the token embedding


    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward instead of keeping them (timm's
        API): activation memory drops from one set per block to one, for ~1/3 more compute."""
        self.grad_checkpointing = enable


def _init_gpt(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear):
        nn.init.zeros_(module.bias)
