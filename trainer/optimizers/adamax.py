"""Adamax (Kingma & Ba 2015, section 7.1): Adam with the infinity norm of past gradients."""

from __future__ import annotations

from typing import cast

import torch

from trainer.optimizers import OPTIMIZERS
from trainer.optimizers.adam import AdamConfig


@OPTIMIZERS.register("adamax")
class Adamax:
    """Adamax: Adam's step scaled by the largest recent gradient (torch.optim.Adamax)."""

    Config = AdamConfig  # Adam's settings: betas, eps, weight_decay

    @staticmethod
    def build(config: AdamConfig, groups, lr: float) -> torch.optim.Optimizer:
        betas = cast("tuple[float, float]", tuple(config.betas))  # two: AdamConfig.check
        return torch.optim.Adamax(groups, lr=lr, betas=betas, eps=config.eps,
                                  weight_decay=config.weight_decay)
