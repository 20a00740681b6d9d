"""The GRU cell as the GRU baseline report writes it (Boustany & Sarfati, section 2.1).

    Γ_r = σ(W_r [c_{t-1}, x_t] + b_r)                 relevance (reset) gate
    c~_t = tanh(W_c [Γ_r ⊙ c_{t-1}, x_t] + b_c)       candidate: the gate before the product
    Γ_u = σ(W_u [c_{t-1}, x_t] + b_u)                 update gate
    c_t = Γ_u ⊙ c~_t + (1 − Γ_u) ⊙ c_{t-1}

``torch.nn.GRUCell`` (Cho et al.'s other form) applies the reset gate after the
product, ``tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))``, and keeps ``1 − z`` for the new
value: the two differ in where the gate sits, and are not the same function for any
weights. ``gru_init``'s ``cell: torch`` keeps nn.GRUCell.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ReportGRUCell(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.gates = nn.Linear(hidden_size + input_size, 2 * hidden_size)  # W_r, W_u stacked
        self.candidate = nn.Linear(hidden_size + input_size, hidden_size)  # W_c

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        """x [N, input], c [N, hidden] -> the next c [N, hidden]."""
        relevance, update = torch.sigmoid(self.gates(torch.cat([c, x], -1))).chunk(2, -1)
        candidate = torch.tanh(self.candidate(torch.cat([relevance * c, x], -1)))
        return update * candidate + (1 - update) * c
