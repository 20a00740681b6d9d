"""The global image feature: the mean over the valid locations."""

from __future__ import annotations

from torch import Tensor


def masked_mean(feats: Tensor, mask: Tensor) -> Tensor:
    """[N, L, D], [N, L] bool -> [N, D]"""
    weights = mask.to(feats.dtype)[:, :, None]
    return (feats * weights).sum(1) / weights.sum(1).clamp(min=1)
