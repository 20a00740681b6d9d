"""GRU cells whose products of the input are taken ahead of the recurrence (teacher forcing).

A GRU's gates read the input x_t and the state; the input's share of them does not depend
on the state, so for teacher-forced words it is one product for every step
(:meth:`GRUCell.project`) and a step multiplies only the state (:meth:`GRUCell.step`).
:meth:`StepsAhead.steps` runs the steps over a whole sequence, taking the weights a step reads
once: the report's cell (trainer/modules/report_gru.py) keeps its two nn.Linear on [c, x], and
a slice of a weight taken at every step would cost, in backward, a zero-filled gradient of
the whole weight per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class StepsAhead:
    """A cell with ``project(x)`` (the input's share of its gates, [..., I] -> [..., S]),
    ``state_weights()`` (what a step multiplies the state by) and ``step(share, c, weights)``."""

    if TYPE_CHECKING:  # what the cell defines
        def state_weights(self) -> tuple[Tensor, Tensor]: ...

        def step(self, share: Tensor, c: Tensor,
                 weights: tuple[Tensor, Tensor] | None = None) -> Tensor: ...

    def steps(self, shares: Tensor, c: Tensor) -> Tensor:
        """Every step's input share [T, N, S] from the state c [N, H] -> the states [N, T, H]."""
        weights, states = self.state_weights(), []
        for share in shares.unbind(0):
            c = self.step(share, c, weights)
            states.append(c)
        return torch.stack(states, 1)


class GRUCell(StepsAhead, nn.GRUCell):
    """``nn.GRUCell`` (its parameters, initialisation and state-dict names), split:

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),  h' = (1 - z) * n + z * h
    """

    def project(self, x: Tensor) -> Tensor:
        """x [..., I] -> W_i x + b_i for the three gates, [..., 3H]."""
        return F.linear(x, self.weight_ih, self.bias_ih)

    def state_weights(self) -> tuple[Tensor, Tensor]:
        return self.weight_hh, self.bias_hh

    def step(self, share: Tensor, h: Tensor,
             weights: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """x's share [N, 3H] (:meth:`project`), h [N, H] -> h' [N, H], as nn.GRUCell computes it."""
        x_r, x_z, x_n = share.chunk(3, 1)
        h_r, h_z, h_n = F.linear(h, *(weights or self.state_weights())).chunk(3, 1)
        r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        return n + z * (h - n)
