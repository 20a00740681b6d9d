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


def table_labels(objective) -> dict:
    """How a table names the training a checkpoint had (``SCST``, ``reinforcement``): saved in
    the checkpoint and copied into metrics.json, so reports need no registry."""
    return {"training": objective.label, "family": objective.family}


def table_labels_of(experiment: dict) -> dict:
    """:func:`table_labels` of a saved experiment's objective (``xe`` when it names none); an
    objective no longer registered keeps its name, of an unknown family."""
    name = (experiment.get("objective") or {}).get("name", "xe")
    return table_labels(OBJECTIVES.get(name)) if name in OBJECTIVES else \
        {"training": name, "family": "unknown"}


import_modules(__name__, __path__)  # each registers itself


__all__ = ["OBJECTIVES", "Objective", "Setting", "StepKey", "TrainingLoss", "build_objective",
           "table_labels", "table_labels_of"]
