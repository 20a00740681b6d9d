"""Additive (Bahdanau-style) attention over a set of feature vectors.

Show-Attend-Tell's f_att and Top-Down's eq. (3) are the same function:
``a_i = w_a^T tanh(W_va v_i + W_ha h)``, ``alpha = softmax(a)``,
``v_hat = sum_i alpha_i v_i``. ``W_va v_i`` does not depend on the step, so it
is computed once per image (:meth:`project`) and reused at every step.
HACap's e_ti = w_e^T ReLU(L_img a_i + L_lang q + b) is the same with ``activation="relu"``;
poojahira's bottom-up/top-down attention (models.py:34-37 there) is
``a_i = w_a^T dropout(ReLU(W_va v_i + W_ha h))``: ``activation="relu"`` and ``dropout=0.5``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trainer.modules.dropout import Dropout


class AdditiveAttention(nn.Module):
    ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}

    def __init__(self, feature_dim: int, query_dim: int, hidden: int, activation: str = "tanh",
                 dropout: float = 0.0):
        super().__init__()
        self.activation = self.ACTIVATIONS[activation]
        self.feature_proj = nn.Linear(feature_dim, hidden)  # W_va
        self.query_proj = nn.Linear(query_dim, hidden, bias=False)  # W_ha
        self.score = nn.Linear(hidden, 1, bias=False)  # w_a
        # none at 0: no module, so no draw from the generator either
        self.dropout = Dropout(dropout) if dropout else None

    def project(self, feats: Tensor) -> Tensor:
        return self.feature_proj(feats)  # [N, L, D] -> [N, L, A]

    def forward(self, projected: Tensor, feats: Tensor, mask: Tensor,
                query: Tensor) -> tuple[Tensor, Tensor]:
        """-> context [N, D], alpha [N, L] (0 on masked locations)."""
        hidden = self.activation(projected + self.query_proj(query)[:, None])  # [N, L, A]
        if self.dropout is not None:
            hidden = self.dropout(hidden)
        scores = self.score(hidden).squeeze(2).masked_fill(~mask, float("-inf"))  # [N, L]
        alpha = torch.softmax(scores, dim=1)  # [N, L]
        context = torch.bmm(alpha[:, None], feats).squeeze(1)  # [N, D]
        return context, alpha


def doubly_stochastic_penalty(alphas: Tensor, step_mask: Tensor, loc_mask: Tensor) -> Tensor:
    """Show-Attend-Tell's sum_i (1 - sum_t alpha_ti)^2 per caption, over its valid steps
    (``step_mask`` [N, T]) and locations (``loc_mask`` [N, L]): alphas [N, T, L] -> [N]."""
    attended = (alphas * step_mask[:, :, None]).sum(1)  # [N, L]
    return ((1 - attended) ** 2 * loc_mask).sum(1)
