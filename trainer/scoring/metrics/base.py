"""What a metric is: a scorer of candidate captions, giving one or more named values.

A metric is a class registered in ``METRICS`` (one file each, ``trainer/scoring/metrics/``).
Everything else reads what it declares: ``score`` (the evaluation stage) runs it and files
its values, ``capstack report`` makes its columns, and validation scores every epoch on
the value a run's ``train.select_on`` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Texts:
    """What a metric scores, image by image: ``references`` and ``candidates`` tokenized
    (``{id: [caption, ...]}``, one candidate each), and ``captions``, each candidate as it
    was given (the decoded words, space-separated), for figures that read the words."""

    references: dict[int, list[str]]
    candidates: dict[int, list[str]]
    captions: dict[int, str]


class Metric:
    """A metric: the values it gives, where they go, and how to compute them.

    ``values``: their names in metrics.json, in the order :meth:`compute` returns them.
    ``columns``: their headers in report's table, same order; empty for a metric the
    table leaves out. ``keys``: their names for ``train.select_on``, given by a metric
    cheap enough to score every epoch's validation (Python only, no Java start-up);
    empty otherwise. ``place``: its columns' place in the table, left to right.
    ``section``: the part of metrics.json its values go in.
    """

    values: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    place: int = 100
    section: str = "metrics"

    def missing(self) -> str | None:
        """Why this metric cannot run on this machine (a program or file absent); None when
        it can. Never a value in its place: the value is None and this is the reason."""
        return None

    def compute(self, texts: Texts) -> Sequence[float | int | None]:
        """Its values on these texts, in the order of ``values``."""
        return self.scored(texts)[0]

    def scored(self, texts: Texts) -> tuple[Sequence[float | int | None], np.ndarray | None]:
        """Its values, and the per-image statistics they follow from: an array [images, k]
        in ``texts.candidates``' order whose rows, summed over any set of the images (a
        bootstrap resample: trainer/scoring/bootstrap.py), give its values on that set
        through :meth:`aggregate`. None for a metric whose value does not decompose so
        (METEOR's and SPICE's are not the mean of their images' scores)."""
        return self.compute(texts), None

    def aggregate(self, totals: np.ndarray, images: int) -> np.ndarray:
        """Its values from per-image statistics summed over ``images`` images ([..., k] ->
        [..., values]). By default a mean: a metric whose value is the mean of its images'
        scores (CIDEr-D, ROUGE-L)."""
        return totals / images

    @property
    def width(self) -> int:
        """k, the numbers of each image's statistics (:meth:`scored`): one per value for a
        mean (:meth:`aggregate`'s default)."""
        return len(self.values)
