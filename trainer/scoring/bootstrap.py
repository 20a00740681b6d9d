"""Which differences are real: the paired bootstrap over test images (Koehn 2004).

Two systems scored on the same images: resample the images with replacement (the same
resample for both), compute each system's corpus value on the resample from its per-image
statistics (trainer/scoring/metrics/: a metric's ``scored`` and ``aggregate``, so nothing is
scored again), and look at the differences over many resamples: the observed difference,
its percentile interval, and the share of resamples in which the first system is ahead (a
tie counts half: two identical systems are ahead in half of them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pipeline.core.errors import CapstackError
from trainer.scoring.metrics.base import Metric

RESAMPLES = 1000
CONFIDENCE = 0.95
CHUNK = 100  # resamples drawn at a time: [CHUNK, images] counts in memory


@dataclass(frozen=True)
class Difference:
    """``value`` of system A minus system B over the images, and how sure that is."""

    value: str  # the metric value's name (CIDEr, BLEU-4, ...)
    a: float  # each system's value on all the images
    b: float
    difference: float  # a - b
    low: float  # the percentile interval of the difference over the resamples
    high: float
    share: float  # resamples where A is ahead (ties count half)
    images: int
    resamples: int
    confidence: float

    def to_dict(self) -> dict:
        return asdict(self)


def resample_counts(images: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[resamples, images]: how often each image is drawn in each resample (with
    replacement, ``images`` draws each)."""
    draws = rng.integers(0, images, size=(resamples, images))
    flat = draws + images * np.arange(resamples)[:, None]
    return np.bincount(flat.ravel(), minlength=resamples * images).reshape(resamples, images)


def paired_bootstrap(metric: Metric, a: np.ndarray, b: np.ndarray, *,
                     resamples: int = RESAMPLES, seed: int = 0,
                     confidence: float = CONFIDENCE) -> list[Difference]:
    """One :class:`Difference` per value of ``metric``, from the per-image statistics of
    systems ``a`` and ``b`` ([images, k] each, rows of the same images in the same order).
    The same ``seed`` gives the same resamples, so the same result."""
    if a.shape != b.shape or a.ndim != 2 or len(a) == 0:
        raise CapstackError(f"paired bootstrap: the systems' statistics must cover the same "
                            f"images (shapes {a.shape} and {b.shape})")
    if resamples < 1 or not 0 < confidence < 1:
        raise CapstackError(f"paired bootstrap: resamples must be 1 or more and confidence "
                            f"between 0 and 1 (got {resamples}, {confidence})")
    images = len(a)
    full_a = metric.aggregate(a.sum(axis=0), images)
    full_b = metric.aggregate(b.sum(axis=0), images)
    rng = np.random.default_rng(seed)
    differences = []
    for start in range(0, resamples, CHUNK):
        counts = resample_counts(images, min(CHUNK, resamples - start), rng).astype(np.float64)
        differences.append(metric.aggregate(counts @ a, images)
                           - metric.aggregate(counts @ b, images))
    d = np.concatenate(differences)  # [resamples, values]
    low, high = np.quantile(d, [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)
    share = (d > 0).mean(axis=0) + 0.5 * (d == 0).mean(axis=0)
    return [Difference(name, float(full_a[k]), float(full_b[k]), float(full_a[k] - full_b[k]),
                       float(low[k]), float(high[k]), float(share[k]), images, resamples,
                       confidence) for k, name in enumerate(metric.values)]
