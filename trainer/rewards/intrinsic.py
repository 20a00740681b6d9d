"""HACap's intrinsic reward (LeakGAN's): how far each word moved D's features along the goals.

Not a registered reward: it scores words, not captions, from what the decoder
computed while reading them (D's leaked features f [N, T+1, F] and the
MANAGER's goals g [N, T, F]). The adversarial objective gives it to the WORKER
(trainer/objectives/adversarial.py); the MANAGER's own term stays the decoder's
(``manager_cosines`` in trainer/decoders/hacap.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def intrinsic_rewards(features: Tensor, goals: Tensor, horizon: int, last: Tensor) -> Tensor:
    """The WORKER's reward for word t (1-based, the f_t it leads to) [N, T]:
    (1/c) sum_{i=1..c} cos(f_t - f_{t-i}, g_{t-i}) over t-i >= 0 (LeakGAN), 0 after ``<eos>``
    (``last`` [N]: the index of each caption's ``<eos>``)."""
    n, steps = goals.shape[:2]
    t = torch.arange(1, steps + 1, device=goals.device).expand(n, -1)
    total = goals.new_zeros(n, steps)
    for i in range(1, horizon + 1):
        earlier = (t - i).clamp(min=0)
        moved = _pick(features, t) - _pick(features, earlier)
        goal = goals.gather(1, earlier[:, :, None].expand(-1, -1, goals.shape[2]))
        cos = F.cosine_similarity(moved, goal, dim=2, eps=1e-8)
        total = total + cos * (t - i >= 0)
    return total / horizon * (t <= last[:, None])


def _pick(f: Tensor, index: Tensor) -> Tensor:
    """f [N, T+1, F] at positions ``index`` [N, T] -> [N, T, F]."""
    return f.gather(1, index[:, :, None].expand(-1, -1, f.shape[2]))


__all__ = ["intrinsic_rewards"]
