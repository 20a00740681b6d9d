"""Which words a vocabulary keeps, and in which order: a rule chosen by name at ``prepare``.

One file per rule, registered with ``@VOCAB_RULES.register(name)``; importing this package
imports every module in it, so adding a rule is one new file here.

``capstack`` (the default)
    Words of the train split (``restval`` counts as train) seen at least ``min_count``
    times, by count (descending), ties alphabetical.
``rtl``
    self-critical.pytorch's ``scripts/prepro_labels.py`` (neuraltalk2's ``prepro.py``
    before it): words of **every** split seen **more than** ``min_count`` times (its
    ``word_count_threshold``), in the order they are first seen, images and captions in
    the json's order. Its ``UNK`` is capstack's ``<unk>``. Use it to reproduce the peer's
    vocabulary (and its published 9,487 words on Karpathy COCO at threshold 5); it counts
    the test captions' words, which the default does not.

Either way a word spelled like a special token (``<eos>``) is never kept
(pipeline/captions/vocab.py).
"""

from __future__ import annotations

from typing import Callable

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.captions.vocab import Vocabulary
from pipeline.core.registry import Registry, import_modules

VOCAB_RULES = Registry("vocabulary rule")
DEFAULT_RULE = "capstack"

Rule = Callable[[KarpathyDataset, int], Vocabulary]


def build_vocabulary(rule: str, dataset: KarpathyDataset, min_count: int) -> Vocabulary:
    return VOCAB_RULES.get(rule)(dataset, min_count)


import_modules(__name__, __path__)  # each registers itself
