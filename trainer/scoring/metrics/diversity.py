"""How varied a split's predicted captions are: distinct-n, vocabulary used, unique captions.

Adversarial captioning (HACap, LeakGAN) is meant to make captions more diverse;
these figures say whether it did. They read the predicted captions only (no
references) and are computed over all captions of the split together, each
caption a list of words as decoded (``<bos>``, ``<eos>`` and ``<pad>`` already
dropped):

* ``distinct-n`` (Li et al. 2016, "A Diversity-Promoting Objective Function for
  Neural Conversation Models"): the number of distinct n-grams over all
  captions divided by the total number of n-grams over all captions. N-grams
  never cross a caption's end; a caption shorter than n has none. ``None`` when
  there is no n-gram at all (the ratio is undefined, no value is made up).
* ``vocab_used``: the number of distinct words over all captions.
* ``unique_captions``: the number of distinct captions (as word sequences)
  divided by the number of captions; ``None`` without captions.
* ``mean_length``: the mean number of words per caption; ``None`` without
  captions.

They are filed under metrics.json's ``diversity`` and left out of report's table.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts

DISTINCT_N = (1, 2)


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The n-grams of one caption, in order (none when it has fewer than ``n`` words)."""
    if n < 1:
        raise ValueError(f"n must be 1 or more, got {n}")
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def distinct_n(captions: Sequence[Sequence[str]], n: int) -> float | None:
    """Distinct n-grams / total n-grams over all ``captions`` (None when there are none)."""
    total, seen = 0, set()
    for words in captions:
        grams = ngrams(words, n)
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else None


def diversity(captions: Sequence[Sequence[str]]) -> dict[str, float | int | None]:
    """The figures of the module's docstring, under the keys metrics.json keeps them:
    ``distinct-1``, ``distinct-2``, ``vocab_used``, ``unique_captions``, ``mean_length``,
    and ``captions`` (how many were counted)."""
    captions = [list(words) for words in captions]
    count = len(captions)
    figures: dict[str, float | int | None] = {
        f"distinct-{n}": distinct_n(captions, n) for n in DISTINCT_N}
    figures["vocab_used"] = len({w for words in captions for w in words})
    figures["unique_captions"] = len({tuple(words) for words in captions}) / count if count \
        else None
    figures["mean_length"] = sum(len(words) for words in captions) / count if count else None
    figures["captions"] = count
    return figures


@METRICS.register("diversity")
class Diversity(Metric):
    """distinct-1/2, words used, unique captions, mean length: the predicted captions only."""

    values = (*(f"distinct-{n}" for n in DISTINCT_N), "vocab_used", "unique_captions",
              "mean_length", "captions")
    section = "diversity"
    place = 60

    def compute(self, texts: Texts) -> list[float | int | None]:
        figures = diversity([caption.split() for caption in texts.captions.values()])
        return [figures[name] for name in self.values]
