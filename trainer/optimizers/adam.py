"""Adam (Kingma & Ba 2015): the papers' optimiser, and capstack's default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from trainer.bounds import bounded
from trainer.optimizers import OPTIMIZERS


@dataclass
class AdamConfig:
    betas: list[float] = bounded(low=0, below=1, default_factory=lambda: [0.9, 0.999])
    eps: float = bounded(1e-8, above=0)
    weight_decay: float = bounded(0.0, 0)  # L2, added to the gradient (torch.optim.Adam's)

    def check(self):
        if len(self.betas) != 2:
            yield "betas: expected two numbers"


@OPTIMIZERS.register("adam")
class Adam:
    """Adam: moving averages of the gradient and its square (torch.optim.Adam)."""

    Config = AdamConfig

    @staticmethod
    def build(config: AdamConfig, groups, lr: float) -> torch.optim.Optimizer:
        betas = cast("tuple[float, float]", tuple(config.betas))  # two: AdamConfig.check
        return torch.optim.Adam(groups, lr=lr, betas=betas, eps=config.eps,
                                weight_decay=config.weight_decay, fused=fusable(groups))


FUSED_DEVICES = ("cpu", "cuda")


def fusable(groups) -> bool:
    """Whether torch's fused Adam can step these parameters (float, on the CPU or CUDA): one
    kernel per tensor instead of several passes over it (``benchmarks/step_profile.py``'s
    optimiser row). The same update up to float rounding."""
    params = [p for group in groups for p in (group["params"] if isinstance(group, dict)
                                              else [group])]
    return bool(params) and all(p.device.type in FUSED_DEVICES and p.is_floating_point()
                                for p in params)
