"""Additive (Bahdanau-style) attention over a set of feature vectors.

Show-Attend-Tell's f_att and Top-Down's eq. (3) are the same function:
``a_i = w_a^T tanh(W_va v_i + W_ha h)``, ``alpha = softmax(a)``,
``v_hat = sum_i alpha_i v_i``. ``W_va v_i`` does not depend on the step, so it
is computed once per image (:meth:`project`) and reused at every step.
HACap's e_ti = w_e^T ReLU(L_img a_i + L_lang q + b) is the same with ``activation="relu"``;
poojahira's bottom-up/top-down attention (models.py:34-37 there) is
``a_i = w_a^T dropout(ReLU(W_va v_i + W_ha h))``: ``activation="relu"`` and ``dropout=0.5``.

The features are per image and the queries per row, k rows of each image (a caption, a
sample, a beam; trainer/decoders/base.py): the k queries of an image attend over its
features in one broadcast, [B, 1, L, A] + [B, k, 1, A], so neither the features nor their
projection is copied for every row, and their gradients add up per image.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trainer.modules.dropout import Dropout


class AdditiveAttention(nn.Module):
    # in place, on the sum made for them: a [B, k, L, A] tensor less to allocate at every step
    ACTIVATIONS = {"tanh": torch.tanh_, "relu": torch.relu_}

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

    def forward(self, projected: Tensor, values: Tensor, mask: Tensor,
                query: Tensor) -> tuple[Tensor, Tensor]:
        """projected [B, L, A], values [B, L, D], mask [B, L], query [N, Q] (N = B * k rows)
        -> context sum_i alpha_i values_i [N, D], alpha [N, L] (0 on masked locations).

        The values are the features, or a linear image of each (W v_i + b) where the context
        is read only through W: the weighted sum of the images is the image of the sum."""
        queries = grouped_queries(self.query_proj(query), projected.shape[0])  # [B, k, 1, A]
        hidden = self.activation(projected[:, None] + queries)  # [B, k, L, A]
        if self.dropout is not None:
            hidden = self.dropout(hidden)
        return attend(self.score(hidden).squeeze(-1), values, mask)


def grouped_queries(queries: Tensor, images: int) -> Tensor:
    """Rows' queries [N, A] -> [B, k, 1, A], to broadcast over an image's L locations."""
    return queries.view(images, queries.shape[0] // images, 1, queries.shape[1])


def attend(scores: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Each image's rows' scores [B, k, L] over its values [B, L, D], masked [B, L] ->
    softmax-weighted values [B * k, D] and the weights alpha [B * k, L]."""
    alpha = torch.softmax(scores.masked_fill(~mask[:, None], float("-inf")), dim=-1)
    context = torch.bmm(alpha, values)  # [B, k, D]
    return context.flatten(0, 1), alpha.flatten(0, 1)


def doubly_stochastic_penalty(alphas: Tensor, step_mask: Tensor, loc_mask: Tensor) -> Tensor:
    """Show-Attend-Tell's sum_i (1 - sum_t alpha_ti)^2 per caption, over its valid steps
    (``step_mask`` [N, T]) and locations (``loc_mask`` [N, L]): alphas [N, T, L] -> [N]."""
    attended = (alphas * step_mask[:, :, None]).sum(1)  # [N, L]
    return ((1 - attended) ** 2 * loc_mask).sum(1)
