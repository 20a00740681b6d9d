"""Words and reference captions the reward tests score against the reference implementations."""

from __future__ import annotations

import numpy as np

WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", "a", "red", "blue", "circle", "square", "on",
         "the", "left", "of", "right", "big", "small", "and"]
REFS = {
    10: ["a red circle on the left", "a big red circle", "red circle left of a blue square",
         "a circle", "there is a red circle on the left of the image"],
    11: ["a blue square", "a small blue square on the right", "blue square", "a square",
         "an image of a blue square"],  # "an", "image" are not in the vocabulary
    12: ["a red circle and a blue square", "a circle and a square", "red circle blue square"],
    13: ["a a a a", "a"],
}


def token_ids(captions: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Word lists -> token ids [B, T] as SCST passes them (zeros after the words), lengths [B]."""
    ids = {w: i for i, w in enumerate(WORDS)}
    lengths = np.array([len(c) for c in captions])
    tokens = np.zeros((len(captions), max(lengths.max(), 1)), np.int64)
    for k, c in enumerate(captions):
        tokens[k, :len(c)] = [ids[w] for w in c]
    return tokens, lengths
