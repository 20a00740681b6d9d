"""``rtl``: self-critical.pytorch's prepro_labels.py: every split's words, first seen first."""

from __future__ import annotations

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.captions.vocab import SPECIALS, Vocabulary
from pipeline.captions.vocab_rules import VOCAB_RULES


@VOCAB_RULES.register("rtl")
def all_words_first_seen(dataset: KarpathyDataset, min_count: int) -> Vocabulary:
    """prepro_labels.py's: words of every split seen more than min_count times, first seen first."""
    counts: dict[str, int] = {}
    for image in dataset.images:
        for sentence in image.sentences:
            for token in sentence.tokens:
                counts[token] = counts.get(token, 0) + 1
    kept = [w for w, c in counts.items() if c > min_count and w not in SPECIALS]
    return Vocabulary(kept, {w: counts[w] for w in kept}, min_count, rule="rtl")
