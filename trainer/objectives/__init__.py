"""Training objectives, found by name like decoders: ``objective: {name: scst, samples: 5}``.

Each module registers its class with ``@OBJECTIVES.register(name)``; importing
this package imports them all. Adding an objective is one new file here plus
its import below (trainer/objectives/base.py says what an objective is).
"""

from __future__ import annotations

from pipeline.core.registry import Registry

OBJECTIVES = Registry("objective")

from trainer.objectives import (adversarial, c2f,  # noqa: E402,F401  (each registers itself)
                                cross_entropy, interleaved_pretraining, scst)
from trainer.objectives.base import Objective, Setting, StepKey, TrainingLoss  # noqa: E402


def build_objective(name: str, config, setting: Setting) -> Objective:
    """The registered objective ``name`` built from its (already checked) config dataclass."""
    return OBJECTIVES.get(name)(config, setting)


__all__ = ["OBJECTIVES", "Objective", "Setting", "StepKey", "TrainingLoss", "build_objective"]
