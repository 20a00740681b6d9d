"""Captions for a list of images from cached features, batched, as decoding options say
(trainer/decoding/options.py; n captions per image among them).

A command's decode (``capstack evaluate``, ``capstack caption``) can run for minutes (a wide beam,
long captions): it shows a progress bar over the images, and a Ctrl-C ends it at once, with one
line saying how far it got; the commands write nothing before the decode has ended.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
from tqdm import tqdm

from pipeline.captions.vocab import Vocabulary
from pipeline.core.errors import CapstackError
from trainer.batch import EvalBatch
from trainer.decoders.base import Decoder
from trainer.decoding import Beam, DecodingConfig, Greedy, Options, decode


@dataclass
class Prediction:
    image_id: int
    words: list[str]
    logprob: float
    alphas: np.ndarray | None  # [len(words) + 1, L]: one row per word, then <eos>
    boxes: np.ndarray | None  # [L, 4] for region stores
    rank: int = 1  # its place among its image's captions (n of them per image), from 1


@torch.no_grad()
def predict(model: Decoder, vocab: Vocabulary, batches: Iterable[EvalBatch], device: torch.device,
            options: Options | DecodingConfig | None = None, *, autocast=nullcontext,
            progress: int | None = None, beam_size: int | None = None,
            max_len: int | None = None) -> list[Prediction]:
    """Every image of ``batches`` decoded as ``options`` say (:func:`~trainer.decoding.decode`;
    greedy decoding of 16 words when None): its n captions of each image adjacent, ranked.
    ``beam_size`` and ``max_len`` without ``options`` are short for :func:`options_of`'s.

    ``progress``, the number of images ``batches`` hold, makes it a command's decode: a progress
    bar over them (:func:`decoding_bar`), and a Ctrl-C said in one line (a
    :class:`CapstackError` naming how many images were decoded) rather than click's bare
    "Aborted!"; nothing is returned, so the command writes nothing. SIGTERM's error passes
    through as it is. Without it a Ctrl-C stays the ``KeyboardInterrupt`` it is (a training's
    validation records the training stopped)."""
    if options is None:
        options = options_of(beam_size or 1, max_len or 16)
    elif beam_size is not None or max_len is not None:
        raise TypeError("predict: beam_size and max_len only without options")
    if isinstance(options, DecodingConfig):
        options = options.options()
    was_training = model.training
    model.eval()
    out: list[Prediction] = []
    decoded_images = 0
    bar = decoding_bar(progress)
    try:
        for batch in batches:
            batch = batch.to(device)
            with autocast():
                ctx = model.encode(batch.feats, batch.mask)
                decoded = decode(model, ctx, options, vocab)
            out += _predictions(vocab, batch, decoded)
            decoded_images += len(batch.image_ids)
            bar.update(len(batch.image_ids))
    except KeyboardInterrupt:
        if progress is None:
            raise
        raise CapstackError(f"interrupted (Ctrl-C) while decoding, after {decoded_images} of "
                            f"{progress} images: nothing written") from None
    finally:
        bar.close()
        model.train(was_training)
    return out


def options_of(beam_size: int, max_len: int) -> Options:
    """Plain beam search of ``beam_size`` (greedy decoding for 1) and ``max_len`` words."""
    return Beam(beam_size, max_len) if beam_size > 1 else Greedy(max_len)


def decoding_bar(images: int | None) -> tqdm:
    """A progress bar over ``images`` images on stderr (none for None), shown only where stderr
    is a terminal (in a stage's log or a program's captured output its redraws would be noise
    among the lines read), and gone once the decode ends."""
    return tqdm(total=images, desc="decode", unit="img", file=sys.stderr, leave=False,
                disable=True if images is None else None)


def _predictions(vocab: Vocabulary, batch: EvalBatch, decoded) -> list[Prediction]:
    tokens = decoded.tokens.cpu().numpy()
    scores = decoded.scores.cpu().numpy()
    alphas = decoded.alphas.float().cpu().numpy() if decoded.alphas is not None else None
    n = tokens.shape[0] // len(batch.image_ids)  # captions per image, adjacent
    preds = []
    for row in range(tokens.shape[0]):
        k, image_id = row // n, batch.image_ids[row // n]
        words = vocab.decode(tokens[row])
        valid = int(batch.mask[k].sum())
        preds.append(Prediction(
            image_id, words, float(scores[row]),
            alphas[row, :len(words) + 1, :valid] if alphas is not None else None,
            batch.boxes[k, :valid].numpy() if batch.boxes is not None else None, row % n + 1))
    return preds
