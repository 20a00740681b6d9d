"""The vocabulary: words <-> ids, with four special tokens first.

``<pad>`` = 0 pads label rows, ``<bos>`` = 1 starts decoding, ``<eos>`` = 2 ends
a caption, ``<unk>`` = 3 stands for every word the vocabulary does not keep. Which words
it keeps, and in which order, is its rule's (pipeline/captions/vocab_rules/: by default
the train split's words seen at least ``min_count`` times, by count, ties alphabetical), so
the same captions always give the same ids.

A caption word spelled like a special token (``<eos>`` in a dataset's tokens) is a word, not
the token: it is encoded as ``<unk>`` (never as the special id, which would end or pad the
caption mid-way) and is neither counted nor kept as a vocabulary word.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Sequence

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json
from pipeline.core.tokens import (BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, SPECIALS,  # noqa: F401
                                  UNK, UNK_ID)


def digest_words(itow: Sequence[str]) -> str:
    return hashlib.md5(json.dumps(list(itow)).encode()).hexdigest()


class Vocabulary:
    def __init__(self, words: Sequence[str], counts: dict[str, int] | None = None,
                 min_count: int = 1, rule: str = "capstack"):
        self.itow = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.wtoi = {w: i for i, w in enumerate(self.itow)}
        self.counts = dict(counts or {})
        self.min_count = min_count
        self.rule = rule  # the vocabulary rule that chose the words (vocab_rules/)

    def __len__(self) -> int:
        return len(self.itow)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and self.itow == other.itow

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Word ids of caption ``tokens``; unknown words and words spelled like a special token
        (``<eos>``, ``<pad>``, ...) are ``<unk>``."""
        return [i if i > UNK_ID else UNK_ID for i in (self.wtoi.get(t, UNK_ID) for t in tokens)]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words of ``ids`` up to the first ``<eos>``; ``<pad>`` and ``<bos>`` skipped."""
        words = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            words.append(self.itow[i])
        return words

    def digest(self) -> str:
        """md5 of the id -> word list: what checkpoints and reward caches compare."""
        return digest_words(self.itow)

    def to_json(self) -> dict:
        return {"itow": self.itow, "counts": self.counts, "min_count": self.min_count,
                "rule": self.rule,
                "specials": {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}}

    @classmethod
    def from_json(cls, data: dict, source: str = "vocabulary") -> "Vocabulary":
        itow = data.get("itow") if isinstance(data, dict) else None
        if not isinstance(itow, list) or list(itow[:4]) != list(SPECIALS):
            raise CapstackError(f'{source}: "itow" must be a list starting with '
                                f"{', '.join(SPECIALS)}")
        return cls(itow[4:], data.get("counts"), data.get("min_count", 1),
                   data.get("rule", "capstack"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        return cls.from_json(read_json(path, "vocabulary"), str(path))
