"""The Simple Recurrent Unit (Lei et al.), as HACap writes it (its section 3.4). With u_t the input:

    x~_t = W u_t
    f_t  = sigmoid(W_f u_t + b_f)           forget gate: reads the input only
    r_t  = sigmoid(W_r u_t + b_r)           reset gate: reads the input only
    c_t  = f_t * c_{t-1} + (1 - f_t) * x~_t
    h_t  = r_t * tanh(c_t) + (1 - r_t) * W_h u_t      (the highway term)

No gate reads h_{t-1}: the four matrix products of a whole sequence are one
batched product (:meth:`SRUCell.project`), and what stays sequential is the
element-wise recurrence of c (:meth:`SRUCell.forward`). :meth:`SRUCell.step` is
the same cell one input at a time, for decoding; the two agree exactly.

The cell's state is c alone (h is a function of c and the input). States are
batch-first: ``[N, H]`` for a cell, ``[N, layers, H]`` for a stack.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn


class SRUCell(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.transform = nn.Linear(input_size, 2 * hidden_size, bias=False)  # W and W_h
        self.gates = nn.Linear(input_size, 2 * hidden_size)  # W_f, b_f and W_r, b_r
        nn.init.orthogonal_(self.transform.weight)  # the recurrent unit's weights: orthogonal
        nn.init.orthogonal_(self.gates.weight)
        nn.init.zeros_(self.gates.bias)

    def project(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Inputs [..., I] -> x~, f, r, W_h u, each [..., H]: every product of the cell."""
        x, highway = self.transform(u).chunk(2, -1)
        f, r = torch.sigmoid(self.gates(u)).chunk(2, -1)
        return x, f, r, highway

    def step(self, u: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """One input [N, I], the previous cell [N, H] -> (h_t, c_t)."""
        x, f, r, highway = self.project(u)
        c = f * c + (1 - f) * x
        return r * torch.tanh(c) + (1 - r) * highway, c

    def forward(self, u: Tensor, c0: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A sequence [N, T, I] -> h [N, T, H] and c [N, T, H], the products computed at once."""
        x, f, r, highway = self.project(u)
        c = u.new_zeros(u.shape[0], self.hidden_size) if c0 is None else c0
        cells = []
        for t in range(u.shape[1]):  # element-wise only: the cheap part
            c = f[:, t] * c + (1 - f[:, t]) * x[:, t]
            cells.append(c)
        states = torch.stack(cells, 1)
        return r * torch.tanh(states) + (1 - r) * highway, states


class SRU(nn.Module):
    """Stacked SRU cells, each layer reading the one below's h."""

    def __init__(self, input_size: int, hidden_size: int, layers: int = 1):
        super().__init__()
        self.hidden_size, self.layers = hidden_size, layers
        self.cells = nn.ModuleList(SRUCell(input_size if i == 0 else hidden_size, hidden_size)
                                   for i in range(layers))

    def initial(self, u: Tensor, n: int) -> Tensor:
        """The zero state [n, layers, H] on ``u``'s device and dtype."""
        return u.new_zeros(n, self.layers, self.hidden_size)

    def step(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One input [N, I], the state [N, layers, H] -> the top layer's h [N, H], the new state."""
        cells = []
        for i, cell in enumerate(self.cells):
            u, c = cast(SRUCell, cell).step(u, state[:, i])  # self.cells holds SRUCells
            cells.append(c)
        return u, torch.stack(cells, 1)

    def forward(self, u: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A sequence [N, T, I] -> the top layer's h [N, T, H], the last state [N, layers, H]."""
        last = []
        for i, cell in enumerate(self.cells):
            u, cells = cell(u, None if state is None else state[:, i])
            last.append(cells[:, -1])
        return u, torch.stack(last, 1)
