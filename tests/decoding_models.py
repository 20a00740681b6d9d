"""Hand-built decoders for decoding tests: next-word distributions set by hand per image and
previous word (Markov), per step (Timed), or drawn at random (Random), and small helpers."""

from __future__ import annotations

import math

import torch

from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID, Vocabulary
from trainer.config import from_dict
from trainer.decoders.base import Decoder, per_row
from trainer.decoding import DecodingConfig

WORDS = ["a", "dog", "cat", "runs", "the", "on", "grass"]
VOCAB = Vocabulary(WORDS)
ID = VOCAB.wtoi  # word -> id
V = len(VOCAB)
TINY = -30.0  # the logit of a word a hand-built decoder all but forbids


class Markov(Decoder):
    """Next-word logits set by hand per (image, previous word): ``table`` [images, V, V]."""

    has_attention = False

    def __init__(self, table: torch.Tensor):
        super().__init__(None, table.shape[-1], 1)
        self.table = table

    def encode(self, feats, mask):
        return {"image": feats[:, 0, 0].long()}

    def init_state(self, ctx, rows):
        return (per_row(ctx["image"], rows),)

    def step(self, words, state, ctx):
        return self.table[state[0], words], state, None


def markov(*images: dict) -> Markov:
    """One image per mapping {previous word: {next word: probability}}; words not named get
    TINY logits, previous words not named go to <eos>."""
    table = torch.full((len(images), V, V), TINY)
    for i, rules in enumerate(images):
        table[i, :, EOS_ID] = 0.0
        for prev, nexts in rules.items():
            row = table[i, BOS_ID if prev == "<bos>" else ID[prev]]
            row[:] = TINY
            for word, p in nexts.items():
                row[EOS_ID if word == "<eos>" else ID[word]] = math.log(p)
    return Markov(table)


class Timed(Decoder):
    """Next-word logits set by hand per step t alone: ``table`` [T, V] (<eos> after T steps)."""

    has_attention = False

    def __init__(self, steps: list[dict]):
        super().__init__(None, V, 1)
        self.table = torch.full((len(steps) + 1, V), TINY)
        self.table[len(steps), EOS_ID] = 0.0
        for t, nexts in enumerate(steps):
            for word, p in nexts.items():
                self.table[t, EOS_ID if word == "<eos>" else ID[word]] = math.log(p)

    def encode(self, feats, mask):
        return {"image": feats[:, 0, 0]}

    def init_state(self, ctx, rows):
        return (torch.zeros(rows, dtype=torch.long),)

    def step(self, words, state, ctx):
        t = state[0].clamp(max=self.table.shape[0] - 1)
        return self.table[t], (state[0] + 1,), None


def trimmed(tokens: torch.Tensor) -> torch.Tensor:
    """Without the columns of <pad> alone at the end."""
    keep = int((tokens != PAD_ID).any(0).nonzero().max()) + 1
    return tokens[:, :keep]


def context(model: Decoder, images: int = 1):
    feats = torch.arange(images, dtype=torch.float32)[:, None, None]
    return model.encode(feats, torch.ones(images, 1, dtype=torch.bool))


def captions(decoded) -> list[list[str]]:
    return [VOCAB.decode(row) for row in decoded.tokens.tolist()]


def options(**given) -> DecodingConfig:
    return from_dict(DecodingConfig, given, "test", "eval.")


def model_score(model: Markov, words: list[str], image: int = 0) -> float:
    """The model's log-probability of a caption, <eos> included."""
    logp = torch.log_softmax(model.table[image], -1)
    ids = [ID[w] for w in words] + [EOS_ID]
    return sum(float(logp[prev, w]) for prev, w in zip([BOS_ID] + ids[:-1], ids))


class Random(Markov):
    def __init__(self, seed: int, images: int = 3):
        g = torch.Generator().manual_seed(seed)
        super().__init__(torch.randn(images, V, V, generator=g) * 2)

