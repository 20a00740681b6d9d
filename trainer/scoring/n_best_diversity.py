"""How varied each image's n captions are (``--n N``: the beam's n best, or n samples).

trainer/scoring/metrics/diversity.py gives the split's figures over the rank-1 captions; these
read every caption of every image, each a list of words as decoded:

* over all captions pooled, the same figures as rank 1's (:func:`diversity`): ``distinct-1``,
  ``distinct-2`` (distinct n-grams / all n-grams), ``vocab_used`` (distinct words),
  ``unique_captions`` (distinct captions / all captions), ``mean_length``, ``captions``;
* within each image, averaged over the images: ``distinct-1 per image``, ``distinct-2 per
  image`` (an image's distinct n-grams / its n-grams, over its n captions; images without an
  n-gram left out), and ``mBLEU-4`` (Shetty et al. 2017, "Speaking the Same Language"): each
  caption's BLEU-4 against the image's other captions as references (pycocoevalcap's
  per-caption BLEU-4, the closest reference length), averaged over the image's captions, then
  over the images. Lower is more diverse; 1 when an image's captions are all the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean

from trainer.scoring.metrics.diversity import DISTINCT_N, distinct_n, diversity

Captions = Sequence[Sequence[str]]  # one image's captions, each its words
ORDER = 4  # mBLEU-4


def per_image_distinct(by_image: Mapping[int, Captions], n: int) -> float | None:
    """The mean over images of their captions' distinct-n (None when no image has an n-gram)."""
    values = [distinct_n(captions, n) for captions in by_image.values()]
    known = [v for v in values if v is not None]
    return fmean(known) if known else None


def mutual_bleu(captions: Captions) -> list[float]:
    """Each caption's BLEU-4 against the other captions of its image (none for fewer than 2)."""
    if len(captions) < 2:
        return []
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    texts = [" ".join(words) for words in captions]
    scorer = BleuScorer(n=ORDER)
    for i, text in enumerate(texts):
        scorer += (text, texts[:i] + texts[i + 1:])
    _, per_caption = scorer.compute_score(option="closest", verbose=0)
    return [float(x) for x in per_caption[ORDER - 1]]


def mean_mutual_bleu(by_image: Mapping[int, Captions]) -> float | None:
    """mBLEU-4: the mean over images of the mean of :func:`mutual_bleu` (None without an image
    of two captions or more)."""
    per_image = [fmean(scores) for scores in map(mutual_bleu, by_image.values()) if scores]
    return fmean(per_image) if per_image else None


def n_best_diversity(by_image: Mapping[int, Captions]) -> dict[str, float | int | None]:
    """The figures of the module's docstring, and ``n``: the most captions an image has."""
    pooled = [list(words) for captions in by_image.values() for words in captions]
    figures: dict[str, float | int | None] = dict(diversity(pooled))
    figures["n"] = max((len(c) for c in by_image.values()), default=0)
    for n in DISTINCT_N:
        figures[f"distinct-{n} per image"] = per_image_distinct(by_image, n)
    figures[f"mBLEU-{ORDER}"] = mean_mutual_bleu(by_image)
    return figures
