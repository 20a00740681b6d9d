"""An evaluation folder as the report and the comparison read it: ``metrics.json`` (checked),
the training it records, what made its row, and ``image_statistics.json``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import CapstackError, where
from pipeline.core.jsonfile import read_json
from trainer.scoring.metrics import METRICS, STATISTICS_FILE

GIVEN_RESULTS = "results_given.json"  # evaluate RESULTS --refs keeps the captions it scored


def setting_of(doc: dict) -> dict:
    """What made a metrics.json's row (evaluate's ``setting``; {} when it records none)."""
    return doc.get("setting") or {}


def recipe_digest(recipe: dict) -> str:
    """The md5 of a recipe (evaluate's ``recipe_of``: the experiment but its seed): what
    ``setting.recipe`` records, so that the report merges over seeds only runs of one recipe."""
    return hashlib.md5(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def training_of(doc: dict) -> tuple[str, str]:
    """(label, family) of a metrics.json's objective, as evaluate recorded them ("" if not)."""
    return str(doc.get("training") or ""), str(doc.get("family") or "")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics_doc(path: str | Path) -> dict:
    """The whole metrics.json written by evaluate, checked."""
    doc = read_json(path, "metrics file")
    if not isinstance(doc, dict):
        raise CapstackError(f"{where(path)}: expected a JSON object")
    if not isinstance(doc.get("approach"), str) or not doc["approach"]:
        raise CapstackError(f"{where(path, 'approach')}: missing or not a non-empty string")
    metrics = doc.get("metrics")
    if not isinstance(metrics, dict):
        raise CapstackError(f"{where(path, 'metrics')}: missing or not an object")
    for name, value in metrics.items():
        if value is not None and not _is_number(value):
            raise CapstackError(f"{where(path, f'metrics.{name}')}: must be a number or null, "
                                f"got {value!r}")
    if not isinstance(doc.get("setting", {}), dict):
        raise CapstackError(f"{where(path, 'setting')}: must be an object (what made the row)")
    recipe = doc.get("recipe", {})
    if not isinstance(recipe, dict) and not (
            isinstance(recipe, list) and all(isinstance(r, dict) for r in recipe)):
        raise CapstackError(f"{where(path, 'recipe')}: must be an object (the experiment "
                            f"trained) or a list of them (an ensemble's)")
    unavailable = doc.get("unavailable", {})
    if not isinstance(unavailable, dict) or not all(
            isinstance(v, str) for v in unavailable.values()):
        raise CapstackError(f"{where(path, 'unavailable')}: must map metric names to reasons")
    return doc


def load_metrics_file(path: str | Path) -> tuple[str, dict]:
    """(approach, its "metrics" dict) from an evaluate metrics.json; ready for metrics_table."""
    doc = read_metrics_doc(path)
    return doc["approach"], doc["metrics"]


@dataclass
class Evaluation:
    """One evaluation folder: what it is called, and its images' statistics per metric."""

    folder: Path
    label: str  # approach (training)
    image_ids: list[int]
    statistics: dict[str, np.ndarray]  # metric name -> [images, k]
    seed: str = ""  # the training seed evaluate recorded ("" when none was)
    recipe: str = ""  # setting.recipe: the digest of all it was trained with but the seed


def read_evaluation(path: str | Path) -> Evaluation:
    """An evaluation folder (or its metrics.json), with its image statistics, checked."""
    folder = Path(path)
    folder = folder.parent if folder.name == "metrics.json" else folder
    doc = read_metrics_doc(folder / "metrics.json")
    stats_path = folder / STATISTICS_FILE
    if not stats_path.exists():  # a FIFO or a folder there is named by read_json, never read
        raise CapstackError(f"{stats_path}: not found: evaluate again (`capstack evaluate`) to "
                            f"write each image's statistics, which the comparison resamples")
    data = read_json(stats_path, "image statistics")
    ids = data.get("image_ids") if isinstance(data, dict) else None
    per_metric = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids) \
            or not isinstance(per_metric, dict):
        raise CapstackError(f"{where(stats_path)}: expected image_ids (a list of integers) and "
                            f"metrics (per-image rows by metric)")
    if len(set(ids)) != len(ids):
        raise CapstackError(f"{where(stats_path, 'image_ids')}: an image is listed twice; "
                            f"each image's statistics are one row")
    statistics = {name: statistics_rows(stats_path, name, rows, len(ids))
                  for name, rows in per_metric.items()}
    training, _ = training_of(doc)
    label = f"{doc['approach']} ({training})" if training else doc["approach"]
    setting = setting_of(doc)
    return Evaluation(folder, label, ids, statistics, str(setting.get("seed", "")),
                      str(setting.get("recipe", "")))


def statistics_rows(path: Path, name: str, rows: Any, images: int) -> np.ndarray:
    """Metric ``name``'s per-image statistics, [images, k] of finite numbers, k the width the
    metric sums (:attr:`~trainer.scoring.metrics.base.Metric.width`): refused, naming the
    file and the metric, when ragged, of another width or not numbers (a narrower row would
    be aggregated into other values without a word)."""
    expected = METRICS.get(name)().width if name in METRICS else None
    width = f"{expected} numbers" if expected else "finite numbers"
    problem = f"{where(path, f'metrics.{name}')}: expected one row of {width} per image " \
              f"({images} images)"
    try:
        array = np.asarray(rows, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):  # ragged rows, or not numbers
        raise CapstackError(f"{problem}: rows of different lengths or not numbers") from None
    if array.ndim != 2 or len(array) != images:
        raise CapstackError(f"{problem}, got shape {list(array.shape)}")
    if expected and array.shape[1] != expected:
        raise CapstackError(f"{problem}, got rows of {array.shape[1]}")
    if not np.isfinite(array).all():
        raise CapstackError(f"{problem}: not every number is finite")
    return array


def aligned(a: Evaluation, b: Evaluation, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Both evaluations' statistics of metric ``name``, B's rows in A's image order."""
    row_of = {image_id: row for row, image_id in enumerate(b.image_ids)}
    return a.statistics[name], b.statistics[name][[row_of[i] for i in a.image_ids]]


