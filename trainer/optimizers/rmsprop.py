"""RMSProp (Tieleman & Hinton 2012): Show, Attend and Tell's optimiser on Flickr8k."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.bounds import bounded
from trainer.optimizers import OPTIMIZERS


@dataclass
class RMSpropConfig:
    alpha: float = bounded(0.99, low=0, below=1)  # decay of the squared-gradient average
    eps: float = bounded(1e-8, above=0)
    momentum: float = bounded(0.0, low=0, below=1)
    centered: bool = False  # divide by the gradient's estimated variance, not its square
    weight_decay: float = bounded(0.0, 0)


@OPTIMIZERS.register("rmsprop")
class RMSprop:
    """RMSProp: the gradient over a moving root mean square of it (torch.optim.RMSprop)."""

    Config = RMSpropConfig

    @staticmethod
    def build(config: RMSpropConfig, groups, lr: float) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(groups, lr=lr, alpha=config.alpha, eps=config.eps,
                                   momentum=config.momentum, centered=config.centered,
                                   weight_decay=config.weight_decay)
