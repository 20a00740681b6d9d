"""The page's rows: one per image, its captions, references and per-image scores.

A comparison's rows are the images where A's and B's captions differ, each with both captions
(the words one has and the other has not marked: :func:`word_diff`), the references, and per
image each value both evaluations have statistics of (:func:`per_image_values`: the metric on
that image alone, as :meth:`~trainer.scoring.metrics.base.Metric.aggregate` gives it from the
image's own statistics; CIDEr-D and ROUGE-L the image's score, BLEU-n its sentence BLEU).
:func:`ranked` orders them by A - B of one value: A's largest wins first, its largest losses
last.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from trainer.evaluation.evaluations import Evaluation
from trainer.evaluation.page.sources import Known
from trainer.scoring.metrics import METRICS, metrics

DECIMALS = 4  # per-image scores as the page holds them


@dataclass
class Side:
    """One system's part of a row: its captions (rank 1 first), the words of rank 1 that the
    other system's caption lacks (their places), and its attention picture."""

    captions: list[str]
    marked: list[int] = field(default_factory=list)
    attention: Path | None = None

    @property
    def first(self) -> str:
        """The caption scored (rank 1); "" when there is none."""
        return self.captions[0] if self.captions else ""


@dataclass
class Row:
    """One image of the page: its id, each system's side, per-image scores by value name
    (one number per system), its references and image file."""

    image_id: int
    sides: list[Side]
    scores: dict[str, list[float]]
    references: list[str]
    image: Path | None = None
    pair: str = ""  # the seed of the pair of evaluations it comes from, over seeds

    def difference(self, value: str) -> float:
        """A - B of ``value`` on this image (0 when a side has none)."""
        scores = self.scores.get(value)
        return scores[0] - scores[1] if scores and len(scores) == 2 else 0.0


def per_image_values(evaluation: Evaluation) -> dict[str, np.ndarray]:
    """Each value's score on each image alone, in the evaluation's image order: the metric's
    aggregate of the image's own statistics (value name -> [images])."""
    values: dict[str, np.ndarray] = {}
    for name, metric in metrics():
        if name in evaluation.statistics:
            per_image = metric.aggregate(evaluation.statistics[name], 1)
            values.update({value: np.asarray(per_image)[:, k]
                           for k, value in enumerate(metric.values)})
    return values


def value_order(evaluations: Sequence[Evaluation]) -> list[str]:
    """The values every evaluation has per-image statistics of, in the table's order."""
    return [value for name, metric in metrics()
            if all(name in e.statistics for e in evaluations) for value in metric.values]


def word_diff(a: str, b: str) -> tuple[list[int], list[int]]:
    """The places of the words of ``a`` not matched in ``b``, and of ``b`` not in ``a``: the
    words outside the longest matching blocks (difflib), as a diff marks them."""
    words_a, words_b = a.split(), b.split()
    marked_a: list[int] = []
    marked_b: list[int] = []
    matcher = difflib.SequenceMatcher(a=words_a, b=words_b, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag != "equal":
            marked_a += range(a0, a1)
            marked_b += range(b0, b1)
    return marked_a, marked_b


def compared_rows(a: Evaluation, b: Evaluation, known_a: Known, known_b: Known, *,
                  pair: str = "") -> tuple[list[Row], int]:
    """The rows of the images whose captions differ between A and B (in A's image order), and
    how many images read the same in both. Per-image scores are those of the values both
    have statistics of; references and image files from A, else B."""
    values = value_order([a, b])
    scores_a, scores_b = per_image_values(a), per_image_values(b)
    b_row = {image_id: k for k, image_id in enumerate(b.image_ids)}
    rows, same = [], 0
    for k, image_id in enumerate(a.image_ids):
        caption_a = known_a.captions.get(image_id, [])
        caption_b = known_b.captions.get(image_id, [])
        if caption_a[:1] == caption_b[:1]:
            same += 1
            continue
        marked_a, marked_b = word_diff(caption_a[0] if caption_a else "",
                                       caption_b[0] if caption_b else "")
        j = b_row[image_id]
        rows.append(Row(
            image_id,
            [Side(caption_a, marked_a, known_a.attention.get(image_id)),
             Side(caption_b, marked_b, known_b.attention.get(image_id))],
            {v: [round(float(scores_a[v][k]), DECIMALS), round(float(scores_b[v][j]), DECIMALS)]
             for v in values},
            known_a.references.get(image_id) or known_b.references.get(image_id) or [],
            known_a.images.get(image_id) or known_b.images.get(image_id), pair))
    return rows, same


def gallery_rows(evaluation: Evaluation, found: Known) -> list[Row]:
    """One row per image of one evaluation: its captions (every rank), references, per-image
    scores and pictures, in its image order."""
    values = value_order([evaluation])
    scores = per_image_values(evaluation)
    return [Row(image_id, [Side(found.captions.get(image_id, []),
                                attention=found.attention.get(image_id))],
                {v: [round(float(scores[v][k]), DECIMALS)] for v in values},
                found.references.get(image_id, []), found.images.get(image_id))
            for k, image_id in enumerate(evaluation.image_ids)]


def ranked(rows: Sequence[Row], value: str) -> list[Row]:
    """``rows`` by A - B of ``value``: A's largest wins first, its largest losses last (ties
    between; images in id order within a difference)."""
    return sorted(rows, key=lambda r: (-r.difference(value), r.pair, r.image_id))


def default_value(values: Sequence[str]) -> str:
    """The value a page ranks by first: CIDEr when it is there (the papers' headline)."""
    cider = METRICS.get("cider")().values[0] if "cider" in METRICS else ""
    return cider if cider in values else (values[0] if values else "")
