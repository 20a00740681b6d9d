"""Lemmatisers: ``capstack prepare --lemmatize`` puts each caption word in its dictionary form
(``dogs`` -> ``dog``, ``are`` -> ``be``, ``men`` -> ``man``) before the vocabulary is chosen.

Why: HACap (docs/hacap.md) lemmatises its Flickr8k captions (the paper's "official
regularizations"), so ``configs/flickr8k.yaml``'s ``prepare_hacap`` stage passes ``--lemmatize``.
Plural and inflected forms become one word, so the vocabulary is smaller or equal.

A lemmatiser is registered by name in ``LEMMATIZERS`` (``lemmatizers/``, one file each);
``simplemma`` (the PyPI package of that name) is the only one and the default. It works offline:
its English dictionaries ship with it. What it does to a dataset (:func:`lemmatize_dataset`):

- each tokenised word is lemmatised on its own (language ``en``, no context), so the same word
  always gives the same lemma and two runs give the same vocabulary and labels;
- a word the lemmatiser does not know (``simplemma.is_known`` false) stays as it is, and so
  does a word spelled like a special token (``<eos>``);
- a lemma is lowercased like every caption word (simplemma writes ``i`` -> ``I``,
  ``tv`` -> ``TV``);
- the references (``refs_{split}.json``: what validation, evaluation, the rewards and the
  CIDEr-D cache of the ``cider_df`` stage all read) are lemmatised with the same lemmas: each
  is written as its sentence's lemmatised tokens joined by spaces (prepare.py's
  ``coco_references``), so that a model that can only emit lemmas is scored and rewarded
  against lemmas. Its scores compare with other runs on the same lemmatised folder, not with
  published numbers on captions as written.

The prepared folder records the lemmatiser and its installed version (``captions.h5``
attributes ``lemmatizer`` and ``lemmatizer_version``, ``summary.json``'s ``lemmatizer``, each
``refs_{split}.json``'s ``info.lemmatizer``), so its checksums change with either. The stage
engine counts the installed version of each distribution a lemmatiser's file names in
``CODE_DISTRIBUTIONS`` as part of ``capstack prepare``'s code version
(pipeline/engine/codeversion.py): upgrading simplemma makes a prepare stage stale.
"""

from __future__ import annotations

import dataclasses

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.captions.lemmatizers import Lemmatizer


def lemmatize_dataset(dataset: KarpathyDataset, lemmatizer: Lemmatizer) -> KarpathyDataset:
    """The dataset with every caption's tokens lemmatised word by word; raw text, images and
    everything else as they were."""
    lemmas: dict[str, str] = {}  # each distinct word asked once

    def lemma(word: str) -> str:
        if word not in lemmas:
            lemmas[word] = lemmatizer.lemma(word)
        return lemmas[word]

    images = tuple(dataclasses.replace(image, sentences=tuple(
        dataclasses.replace(s, tokens=tuple(lemma(t) for t in s.tokens))
        for s in image.sentences)) for image in dataset.images)
    return dataclasses.replace(dataset, images=images)
