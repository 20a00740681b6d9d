"""Training objectives, found by name like decoders: ``objective: {name: scst, samples: 5}``.

Each module registers its class with ``@OBJECTIVES.register(name)``; importing
this package imports every module in it, so adding an objective is one new file
here (trainer/objectives/base.py says what an objective is).
"""

from __future__ import annotations

from pipeline.core.registry import Registry, import_modules

OBJECTIVES = Registry("objective")

from trainer.objectives.base import Objective, Setting, StepKey, TrainingLoss  # noqa: E402


def build_objective(name: str, config, setting: Setting) -> Objective:
    """The registered objective ``name`` built from its (already checked) config dataclass."""
    return OBJECTIVES.get(name)(config, setting)


import_modules(__name__, __path__)  # each registers itself


__all__ = ["OBJECTIVES", "Objective", "Setting", "StepKey", "TrainingLoss", "build_objective"]
