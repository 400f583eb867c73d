"""A byte-level GRU language model: tokens (batch, seq) -> next-byte logits (batch, seq, 256).

Cho et al. (2014) gated recurrent units, stacked, between a byte embedding and a linear
read-out; the character-level RNN language model of Karpathy's char-rnn with GRU cells.

Training runs `nn.GRU` (PyTorch's fused kernel). Exporting cannot: `nn.GRU` decomposes
into a Python loop over time, which `torch.export` unrolls, fixing the sequence length
of the exported graph to the example's. While exporting, the same weights therefore run
through `scan`, a loop the graph keeps (an ONNX `Scan`; a `scan` node in a torch.export
program), so batch and sequence stay dynamic. The equations are `nn.GRU`'s, and every
export is checked against `nn.GRU` by the zoo's parity test.
"""

from __future__ import annotations

import torch
from torch import nn
from torch._higher_order_ops.scan import scan  # torch >= 2.6; known to torch.export and torch.onnx
from torch.nn import functional as F


def gru_layer(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
              b_hh: torch.Tensor) -> torch.Tensor:
    """One GRU layer from a zero state, batch first, as a `scan` over time.

    r = σ(W_ir x + b_ir + W_hr h + b_hr), z = σ(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)), h' = (1 - z) ⊙ n + z ⊙ h   (nn.GRU's docs)
    """
    inputs = F.linear(x, w_ih, b_ih).transpose(0, 1)  # input gates for all steps at once: (seq, batch, 3h)
    h0 = x.new_zeros(x.shape[0], w_hh.shape[1])

    def step(h: torch.Tensor, gi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gh = F.linear(h, w_hh, b_hh)
        i_r, i_z, i_n = gi.chunk(3, dim=-1)
        h_r, h_z, h_n = gh.chunk(3, dim=-1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        h = (1 - z) * n + z * h
        return h, h.clone()  # (carry, this step's output); scan wants them unaliased

    _, outputs = scan(step, h0, inputs)
    return outputs.transpose(0, 1)


class GRULanguageModel(nn.Module):
    def __init__(self, vocab: int = 256, embed: int = 64, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if torch.compiler.is_exporting():
            for i in range(self.gru.num_layers):
                x = gru_layer(x, *(getattr(self.gru, f"{p}_l{i}") for p in ("weight_ih", "weight_hh", "bias_ih",
                                                                             "bias_hh")))
        else:
            x, _ = self.gru(x)
        return self.head(x)
