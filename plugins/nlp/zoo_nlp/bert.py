"""A BERT encoder with mean pooling: the architecture of sentence-transformers'
all-MiniLM-L6-v2, written here so the plugin needs no `transformers`.

References: Devlin et al., "BERT" (2018) for the post-LayerNorm encoder; Wang et al.,
"MiniLM" (2020) for the 6-layer, 384-wide student it starts from; Reimers & Gurevych,
"Sentence-BERT" (2019) for mean pooling over the attention mask. The maths follows
Hugging Face's `BertModel` exactly (erf GELU, LayerNorm eps 1e-12, absolute learned
positions), so the shipped weights load by renaming only (see `minilm.py`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

#: added to the attention scores of padding keys. exp(-1e4) is exactly 0 in float32, as
#: Hugging Face's finfo.min is, and -1e4 still fits in float16 when a backend casts it.
MASKED = -1e4


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads) + bias  # (b, heads, t, t)
        y = torch.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class EncoderLayer(nn.Module):
    """Post-LN as in the original BERT: x = LN(x + sublayer(x)) for attention and FFN."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.attn = SelfAttention(hidden, heads)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x, bias))
        return self.ffn_norm(x + self.down(F.gelu(self.up(x))))  # exact (erf) GELU, as BERT's "gelu"


class SentenceEncoder(nn.Module):
    """token ids and attention mask (batch, seq) -> L2-normalized embedding (batch, hidden)."""

    def __init__(self, vocab_size: int = 30522, hidden: int = 384, layers: int = 6, heads: int = 12,
                 intermediate: int = 1536, max_positions: int = 512, eps: float = 1e-12) -> None:
        super().__init__()
        self.token_embed = nn.Embedding(vocab_size, hidden)
        self.position_embed = nn.Embedding(max_positions, hidden)
        # BERT's token-type (segment) embedding for segment A: a sentence encoder only ever
        # sees one segment, so only that row is kept.
        self.segment_embed = nn.Parameter(torch.zeros(hidden))
        self.embed_norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, intermediate, eps) for _ in range(layers))
        self.apply(_init_bert)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Indexing the tables rather than calling the modules: torch.onnx's dynamo exporter
        # names the value of the first `aten.embedding` "embedding", the name of our output,
        # and the duplicate makes the ONNX graph invalid.
        x = self.token_embed.weight[input_ids] + self.position_embed.weight[positions] + self.segment_embed
        x = self.embed_norm(x)
        mask = attention_mask.to(x.dtype)  # 1 for tokens, 0 for padding
        bias = (1.0 - mask)[:, None, None, :] * MASKED  # broadcast over heads and queries
        for layer in self.layers:
            x = layer(x, bias)
        # mean over real tokens (sentence-transformers' Pooling, mean_tokens), then unit length
        summed = (x * mask[..., None]).sum(dim=1)
        pooled = summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)


def _init_bert(module: nn.Module) -> None:
    # BERT's initializer_range 0.02, for the random-init (tiny) variant the tests export
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear):
        nn.init.zeros_(module.bias)
