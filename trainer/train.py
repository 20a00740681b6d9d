"""``capstack train``: training on cached features, validated by greedy CIDEr (or the score
``train.select_on`` names) each epoch. The run is trainer/training/ (start.py the entry, run
folders, resume or restart; build.py its parts; position.py where it stands; loop.py its epochs
and steps; log.py its metrics log); this module is the name commands and scripts import it by
(``from trainer.train import train``), and the module the ``train`` stage's code version reads.

Outputs in ``out_dir``: ``last.pt``, ``best.pt`` (best validation CIDEr, or the score
``train.select_on`` names: trainer/training/selection.py), ``metrics.jsonl`` (one JSON object
per logged step or validation), ``config.json``, ``summary.json``, ``state.json`` (running,
finished, failed or stopped: trainer/runs.py), and ``events/`` (TensorBoard) when
``train.tensorboard`` asks for it. After each epoch the caller's ``on_epoch`` gets an
:class:`EpochReport` (``capstack train`` prints it as one line).
"""

from __future__ import annotations

from trainer.training.log import resident_mb
from trainer.training.loop import EpochReport
from trainer.training.start import TrainResult, train

__all__ = ["EpochReport", "TrainResult", "resident_mb", "train"]  # what callers import
