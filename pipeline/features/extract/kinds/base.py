"""What every extractor kind provides; each kind is one file, registered in ``EXTRACTORS``.

A kind is an instance registered under its name (``grid``, ``fpn``, ``c4``, ``c5``,
``bottom-up``). It owns a settings dataclass holding its own settings only, and:

- :meth:`ExtractorKind.prepare`: settings -> an :class:`Extraction` (weights found
  and hashed, the model's output known): the store's word, the fingerprinted
  settings, the metadata, the record schema, the model and the transform;
- :meth:`ExtractorKind.recorded`: a store's recorded settings -> the settings
  dataclass again (what it does not record keeps the dataclass default), and
  :meth:`ExtractorKind.rebuild` the same model from them, for ``capstack caption``.

Nothing outside a kind's own file asks which kind it is.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch

from pipeline.core.errors import CapstackError
from pipeline.features.extract.job import Extraction
from pipeline.features.extract.runner import BatchModel
from pipeline.vision.backbones import RANDOM

DTYPE = "float16"  # a store's feature dtype unless --dtype says otherwise ...
RANDOM_DTYPE = "float32"  # ... or the weights are random (store_dtype)


def store_dtype(dtype: str | None, weights: str | None) -> str:
    """The feature dtype of a store: the one given (``--dtype``), else float16, or float32 for
    random weights. A random deep network's activations grow with depth past float16's 65504
    (a random ResNet-101's layer4 at 224 px reaches about 9e4), which the store refuses."""
    if dtype:
        return dtype
    return RANDOM_DTYPE if weights == RANDOM else DTYPE


def half_precision(weights: str | None) -> bool:
    """Whether extraction may compute in float16 on a GPU: not with random weights, whose
    activations pass float16's range inside the network, before any store sees them."""
    return weights != RANDOM


class ExtractorKind:
    """An extractor kind: its name, the command that runs it and its settings dataclass."""

    command: str  # the capstack command that runs it; recorded as the store's producer name
    Settings: type  # its settings dataclass

    def __init__(self, name: str):
        self.name = name  # its name in EXTRACTORS

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- settings ---------------------------------------------------------------------------
    def setting_names(self) -> list[str]:
        return [f.name for f in fields(self.Settings) if f.init]

    def settings(self, **options) -> object:
        """Its settings dataclass from ``options``; a setting of another kind is refused."""
        unknown = [name for name in options if name not in self.setting_names()]
        if unknown:
            raise CapstackError(f"{self.command} {self.name}: no setting "
                                f"{', '.join(map(repr, unknown))} (its settings: "
                                f"{', '.join(self.setting_names())})")
        return self.Settings(**options)

    def accepts(self, settings) -> bool:
        """Whether ``settings`` are this kind's (its dataclass, for its name)."""
        return type(settings) is self.Settings

    def recorded(self, recorded: dict, weights: str):
        """The settings a store recorded (its producer's), as this kind's dataclass, with
        ``weights`` the file to load now; a setting older stores lack keeps its default."""
        names = set(self.setting_names())
        return self.Settings(**{**{k: v for k, v in recorded.items() if k in names},
                                "weights": weights})

    def made(self, producer: dict) -> bool:
        """Whether this kind made the store whose ``producer`` metadata this is."""
        return producer.get("name") == self.command

    # -- what each kind implements ------------------------------------------------------------
    def prepare(self, settings, dataset_json: Path, device: torch.device) -> Extraction:
        raise NotImplementedError

    def rebuild(self, settings, weights_md5: str, where: str,
                device: torch.device) -> tuple[BatchModel, object]:
        """(batch model, transform) of the extractor a store's recorded ``settings`` describe."""
        raise NotImplementedError
