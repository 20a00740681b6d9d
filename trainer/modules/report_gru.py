"""The GRU cell as the GRU baseline report writes it (Boustany & Sarfati, section 2.1).

    Γ_r = σ(W_r [c_{t-1}, x_t] + b_r)                 relevance (reset) gate
    c~_t = tanh(W_c [Γ_r ⊙ c_{t-1}, x_t] + b_c)       candidate: the gate before the product
    Γ_u = σ(W_u [c_{t-1}, x_t] + b_u)                 update gate
    c_t = Γ_u ⊙ c~_t + (1 − Γ_u) ⊙ c_{t-1}

``torch.nn.GRUCell`` (Cho et al.'s other form) applies the reset gate after the
product, ``tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))``, and keeps ``1 − z`` for the new
value: the two differ in where the gate sits, and are not the same function for any
weights. ``gru_init``'s ``cell: torch`` keeps nn.GRUCell.

As trainer/modules/gru.py's cell, it takes x_t's share of the three products ahead
(:meth:`ReportGRUCell.project`, every teacher-forced step at once) and a step multiplies c
alone (:meth:`ReportGRUCell.step`); the weights stay the two nn.Linear on [c, x].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.modules.gru import StepsAhead


class ReportGRUCell(StepsAhead, nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.gates = nn.Linear(hidden_size + input_size, 2 * hidden_size)  # W_r, W_u stacked
        self.candidate = nn.Linear(hidden_size + input_size, hidden_size)  # W_c

    def project(self, x: Tensor) -> Tensor:
        """x [..., input] -> its share of W_r, W_u and W_c's products with their biases,
        [..., 3 hidden]."""
        h = self.hidden_size
        return F.linear(x, torch.cat([self.gates.weight[:, h:], self.candidate.weight[:, h:]]),
                        torch.cat([self.gates.bias, self.candidate.bias]))

    def state_weights(self) -> tuple[Tensor, Tensor]:
        """c's columns of W_r, W_u (stacked) and of W_c."""
        h = self.hidden_size
        return self.gates.weight[:, :h], self.candidate.weight[:, :h]

    def step(self, share: Tensor, c: Tensor,
             weights: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """x's share [N, 3 hidden] (:meth:`project`), c [N, hidden] -> the next c."""
        gates_c, candidate_c = weights or self.state_weights()
        x_gates, x_candidate = share.split([2 * self.hidden_size, self.hidden_size], -1)
        relevance, update = torch.sigmoid(torch.addmm(x_gates, c, gates_c.t())).chunk(2, -1)
        candidate = torch.tanh(torch.addmm(x_candidate, relevance * c, candidate_c.t()))
        return update * candidate + (1 - update) * c

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        """x [N, input], c [N, hidden] -> the next c [N, hidden]."""
        return self.step(self.project(x), c)
