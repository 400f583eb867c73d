"""A directed message-passing neural network (D-MPNN) on dense, padded molecular graphs.

The architecture is Chemprop's (Yang et al. 2019, "Analyzing Learned Molecular
Representations for Property Prediction", J. Chem. Inf. Model. 59, 3370), which refines
the MPNN framework of Gilmer et al. 2017 ("Neural Message Passing for Quantum
Chemistry", ICML) by passing messages along directed bonds: the message on bond v->w
sums what flows into v from every neighbour except w, so a message never comes
straight back along the bond it just crossed ("totters", in the paper's word).

    h0[v->w]   = ReLU(W_i [x_v || e_vw])
    m[v->w]    = sum_{k in N(v) \\ w} h[k->v]  =  (sum_{k in N(v)} h[k->v]) - h[w->v]
    h[v->w]    = ReLU(h0[v->w] + W_h m[v->w])                       (depth - 1 times)
    a_v        = ReLU(W_o [x_v || sum_{k in N(v)} h[k->v]])
    prediction = mean + std * FFN(readout_v a_v)

Chemprop keeps a sparse list of bonds with index gathers. Here every directed bond of a
batch is a cell of a dense (batch, atoms, atoms, hidden) tensor and the gathers are a sum
over one axis and a transpose, so the graph exports to ONNX and TensorRT as plain
matmuls and reductions with a dynamic atom axis. Padding is exact, not approximate: the
adjacency is zero on padded rows and columns, so every message from or to a padded atom
is zero, and the readout only sees masked atoms. No normalization spans the batch, so a
molecule's prediction is the same alone or beside any other molecules.
"""

from __future__ import annotations

import torch
from torch import nn

from . import READOUTS
from .featurize import ATOM_DIM, BOND_DIM, BOND_TYPE_SLOTS


class DMPNN(nn.Module):
    def __init__(self, hidden: int = 300, depth: int = 3, ffn_hidden: int = 300, dropout: float = 0.0,
                 readout: str = "mean", target_mean: float = 0.0, target_std: float = 1.0):
        super().__init__()
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, not {readout!r}")
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth, self.readout = depth, readout
        # W_i split in its atom and bond halves: W_i [x || e] = W_ia x + W_ib e, so the atom
        # half is computed once per atom instead of once per (atom, atom) pair.
        self.w_i_atom = nn.Linear(ATOM_DIM, hidden, bias=False)  # Chemprop: no bias in W_i, W_h
        self.w_i_bond = nn.Linear(BOND_DIM, hidden, bias=False)
        self.w_h = nn.Linear(hidden, hidden, bias=False)
        self.w_o = nn.Linear(ATOM_DIM + hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.ffn = nn.Sequential(nn.Linear(hidden, ffn_hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(ffn_hidden, 1))
        # the model predicts in real units: the targets' training mean and std are buffers,
        # so they travel with the checkpoint and into every export.
        self.register_buffer("target_mean", torch.tensor(float(target_mean)))
        self.register_buffer("target_std", torch.tensor(float(target_std)))

    def forward(self, atom_features: torch.Tensor, bond_features: torch.Tensor,
                atom_mask: torch.Tensor) -> torch.Tensor:
        """(batch, atoms, ATOM_DIM), (batch, atoms, atoms, BOND_DIM), (batch, atoms) -> (batch,)"""
        mask = atom_mask.to(atom_features.dtype)
        # adjacency from the bond-type one-hot, cut to real atoms so padding can never send
        # or receive a message, even if a caller left non-zero bond features there
        adj = bond_features[..., :BOND_TYPE_SLOTS].sum(-1) * mask[:, :, None] * mask[:, None, :]
        edge = adj.unsqueeze(-1)  # (batch, v, w, 1): 1 where the directed bond v->w exists

        h0 = torch.relu(self.w_i_atom(atom_features).unsqueeze(2) + self.w_i_bond(bond_features)) * edge
        h = h0
        for _ in range(self.depth - 1):
            incoming = h.sum(dim=1)  # (batch, v, hidden): sum over k of h[k->v]
            message = incoming.unsqueeze(2) - h.transpose(1, 2)  # minus the reverse bond h[w->v]
            h = self.dropout(torch.relu(h0 + self.w_h(message))) * edge
        atom = torch.relu(self.w_o(torch.cat([atom_features, h.sum(dim=1)], dim=-1)))
        atom = self.dropout(atom) * mask.unsqueeze(-1)

        pooled = atom.sum(dim=1)
        if self.readout == "mean":  # every real molecule has at least one atom
            pooled = pooled / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return self.target_mean + self.target_std * self.ffn(pooled).squeeze(-1)
