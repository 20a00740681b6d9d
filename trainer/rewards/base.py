"""What every reward is: a registered component that scores sampled captions, as token ids.

    reward = build_reward("bleu", BleuConfig(n=4), captions)  # captions: Setting.captions
    reward.score(image_ids, tokens, lengths)                  # -> [B] float64

``tokens`` [B, T] are vocabulary ids, ``lengths`` [B] the words of each
(``words_and_lengths`` in trainer/objectives/scst.py: the ids up to ``<eos>``,
zeros after), ``image_ids`` [B] the image each caption is of (an image repeats
when it has several samples). A reward is built with its config and the
prepared captions, and builds there whatever it scores against (CIDEr-D loads
its cache; BLEU and ROUGE-L read the train references): scoring a batch then
works on ids alone.

References are the prepared folder's train references tokenized as the CIDEr-D
cache tokenizes them (``simple_tokenize``, :func:`tokenized_references`), so
every reward scores the words validation counts. :class:`References` holds them
as word ids: the captioning vocabulary's, then an id of its own for each word
only the references use (it never matches a sampled word).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from pipeline.core.errors import CapstackError
from trainer.scoring.references import load_references
from trainer.scoring.text import simple_tokenize


class Reward:
    """Subclasses set ``Config`` and implement :meth:`score`."""

    Config: ClassVar[type]

    def __init__(self, config, captions):
        self.config = config

    def score(self, image_ids: Sequence[int] | np.ndarray, tokens: np.ndarray,
              lengths: np.ndarray) -> np.ndarray:
        """[B] rewards of captions ``tokens`` [B, T] (``lengths`` words each) of ``image_ids``."""
        raise NotImplementedError

    def score_parts(self, image_ids: Sequence[int] | np.ndarray, tokens: np.ndarray,
                    lengths: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`score`, and for a reward made of parts each part's own score by name, before
        its weight (the mix's), so a run can log what each part did; one part: none."""
        return self.score(image_ids, tokens, lengths), {}

    def close(self) -> None:
        """Let go of what it holds beyond memory (a scorer process); nothing by default."""


def tokenized_references(captions, split: str = "train") -> dict[int, list[str]]:
    """Image id -> the prepared folder's references of ``split``, each ``simple_tokenize``-d
    (as validation tokenizes, and the CIDEr-D cache)."""
    references = load_references(captions.references_path(split))
    return {i: [simple_tokenize(c) for c in caps] for i, caps in references.items()}


@dataclass
class References:
    """Every image's references as word ids, padded."""

    words: list[str]  # id -> word: the captioning vocabulary, then reference-only words
    image_ids: np.ndarray  # [I] sorted
    start: np.ndarray  # [I + 1] image i's references are rows start[i]..start[i+1]
    tokens: np.ndarray  # [R, L] word ids, 0 after each reference's words
    lengths: np.ndarray  # [R] words

    @classmethod
    def of(cls, references: Mapping[int, Sequence[str]], vocab_words: Sequence[str],
           reward: str) -> "References":
        """``references``: image id -> tokenized captions (space-separated words)."""
        if not references:
            raise CapstackError(f"{reward}: no references to score against")
        ids = {w: i for i, w in enumerate(vocab_words)}
        image_ids = np.array(sorted(references), np.int64)
        rows, start = [], [0]
        for image_id in image_ids:
            rows += [[ids.setdefault(w, len(ids)) for w in c.split()]
                     for c in references[int(image_id)]]
            start.append(len(rows))
        lengths = np.array([len(r) for r in rows], np.int64)
        tokens = np.zeros((len(rows), max(lengths.max(initial=0), 1)), np.int64)
        for k, r in enumerate(rows):
            tokens[k, :len(r)] = r
        return cls(sorted(ids, key=ids.__getitem__), image_ids, np.array(start, np.int64), tokens,
                   lengths)

    def images(self, image_ids: Sequence[int] | np.ndarray, reward: str) -> np.ndarray:
        """[B] the index of each image id, refused naming the first id without references."""
        wanted = np.asarray(image_ids, np.int64)
        index = np.minimum(np.searchsorted(self.image_ids, wanted), len(self.image_ids) - 1)
        known = self.image_ids[index] == wanted
        if not known.all():
            raise CapstackError(f"{reward}: image {wanted[~known][0]} has no references")
        return index


class ReferenceReward(Reward):
    """A reward scored against the train references: :meth:`prepare` readies them once."""

    label: ClassVar[str]  # the reward's name in messages: BLEU, ROUGE-L

    def __init__(self, config, captions):
        super().__init__(config, captions)
        self.references = References.of(tokenized_references(captions), captions.vocab.itow,
                                         self.label)
        self.prepare()

    @classmethod
    def from_references(cls, config, references: Mapping[int, Sequence[str]],
                        vocab_words: Sequence[str]) -> "ReferenceReward":
        """The reward against ``references`` (image id -> tokenized captions) rather than a
        prepared folder's (tests, benchmarks)."""
        reward = cls.__new__(cls)
        Reward.__init__(reward, config, None)
        reward.references = References.of(references, vocab_words, cls.label)
        reward.prepare()
        return reward

    def prepare(self) -> None:
        """Whatever scoring needs of ``self.references``, computed once."""
