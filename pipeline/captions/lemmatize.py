"""Lemmatisers: ``capstack prepare --lemmatize`` puts each caption word in its dictionary form
(``dogs`` -> ``dog``, ``are`` -> ``be``, ``men`` -> ``man``) before the vocabulary is chosen.

Why: HACap (docs/hacap.md) lemmatises its Flickr8k captions (the paper's "official
regularizations"), so ``configs/flickr8k.yaml``'s ``prepare_hacap`` stage passes ``--lemmatize``.
Plural and inflected forms become one word, so the vocabulary is smaller or equal.

A lemmatiser is registered by name in :data:`LEMMATIZERS`; ``simplemma`` (the PyPI package of
that name) is the only one and the default. It works offline: its English dictionaries ship
with it. What it does to a dataset (:func:`lemmatize_dataset`):

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
engine counts the installed version of each distribution named in :data:`CODE_DISTRIBUTIONS`
as part of ``capstack prepare``'s code version (pipeline/engine/codeversion.py): upgrading
simplemma makes a prepare stage stale.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from dataclasses import dataclass
from typing import Callable

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.core.errors import CapstackError
from pipeline.core.registry import Registry
from pipeline.core.tokens import SPECIALS

# Installed distributions whose version is part of the code version of every stage whose code
# imports this module (read, not imported, by pipeline/engine/codeversion.py: keep it a literal).
CODE_DISTRIBUTIONS = ("simplemma",)
LEMMATIZERS = Registry("lemmatizer")
DEFAULT_LEMMATIZER = "simplemma"
SIMPLEMMA_RANGE = "simplemma>=2.0,<3"  # pyproject.toml's range


@dataclass(frozen=True)
class Lemmatizer:
    name: str  # its name in LEMMATIZERS
    version: str  # the installed version of the package that does the work
    lemma: Callable[[str], str]  # one lowercase word -> its lemma (itself when unknown)

    def record(self) -> dict[str, str]:
        """What the prepared folder records of it."""
        return {"name": self.name, "version": self.version}


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (importlib.metadata), None when absent."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_lemmatizer(name: str) -> Lemmatizer:
    """The registered lemmatiser ``name``, its package imported and its version read."""
    return LEMMATIZERS.get(name)()


@LEMMATIZERS.register("simplemma")
def simplemma_english() -> Lemmatizer:
    """simplemma's English dictionaries, word by word (PyPI simplemma, offline)."""
    how = (f"install it into capstack's environment: pip install '{SIMPLEMMA_RANGE}' "
           f"(or `make install`, which installs the pinned version)")
    try:
        import simplemma
    except ImportError:
        raise CapstackError(f"prepare --lemmatize: the simplemma package is not installed; "
                            f"{how}") from None
    version = installed_version("simplemma")
    if version is None:
        raise CapstackError(f"prepare --lemmatize: simplemma imports but has no installed "
                            f"version to record (not installed by pip?); {how}")

    def lemma(word: str) -> str:
        if not word or word in SPECIALS or not simplemma.is_known(word, lang="en"):
            return word
        return simplemma.lemmatize(word, lang="en").lower()

    return Lemmatizer("simplemma", version, lemma)


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
