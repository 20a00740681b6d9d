"""Optimisers, found by name like decoders: ``train: {optimizer: {name: rmsprop, alpha: 0.9}}``.

Each module registers a class with ``@OPTIMIZERS.register(name)``: its ``Config`` (the
settings beside ``train.lr``, which every optimiser shares with the lr schedule) and
``build(config, groups, lr)``, a ``torch.optim`` optimiser over the decoder's parameter
groups. Importing this package imports every module in it, so adding an optimiser is one
new file here. Its state is checkpointed and restored as the run's ``optimizer``.
"""

from __future__ import annotations

import torch

from pipeline.core.registry import Registry, import_modules

OPTIMIZERS = Registry("optimiser")


def build_optimizer(name: str, config, groups: list[dict], lr: float) -> torch.optim.Optimizer:
    """The registered optimiser ``name`` over parameter ``groups``, from its checked config."""
    return OPTIMIZERS.get(name).build(config, groups, lr)


import_modules(__name__, __path__)  # each registers itself

__all__ = ["OPTIMIZERS", "build_optimizer"]
