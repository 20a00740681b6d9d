"""HACap's discriminator trained as LeakGAN trains its own: rounds of D epochs over fresh samples.

LeakGAN's code (CR-Gjx/LeakGAN, ``Image COCO/Main.py``, which HACap builds on)
trains D in *rounds*. A round draws ``generated_num`` sentences from the
generator, as many as the real training set holds, and trains D for 3 epochs
over the real and the drawn sentences; it does that 5 times, with fresh draws
each time. Such a round comes before every stretch of generator pre-training
(16 rounds, 0.6 epoch of maximum likelihood between them) and after every
adversarial generator batch. D's optimiser is Adam at 5e-5 on batches of 64
(``Discriminator.py``, ``dis_batch_size``), without dropout (keep 1.0) and without
an l2 term (``l2_reg_lambda`` is never passed). These are the defaults of
:class:`DiscriminatorSchedule`.

A captioning generator samples for an image. So a set is ``images`` train
images (0: all of them, LeakGAN's "as many as the real set"). Each brings
``seq_per_img`` of its references (real) and as many samples (fake). Samples
are drawn with dropout off, as LeakGAN draws them (``drop_out: 1.0``).

After every round D is scored on what it never trained on: the references of
the first ``heldout_images`` validation images against fresh samples of them.
Its held-out accuracy (and its mean score of each side) goes to the run's
metrics log, one ``discriminator`` entry per round, which the curves figure
draws beside validation CIDEr.

A D that reads the image (``decoder.discriminator_reads_image``, a step beyond
the paper) scores each row with its image's pooled feature: a set then carries,
beside its token rows, each image's pooled feature, which an image's references
and samples share (:class:`CaptionSet`). A text-only D's sets carry none.

Under DDP every rank samples its part of a set's images. The set's token rows
(and pooled images) are summed into one global set on every rank, and every
rank trains D on that set in the same order. So the ranks' copies of D stay
equal without a gradient reduction, and a run on several processes trains D as
one process does. Every draw is a function of (seed, round, set), so an exact
resume repeats it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.core.tokens import BOS_ID, PAD_ID
from trainer.bounds import MAX_BATCH, MAX_IMAGES, MAX_SAMPLES, MAX_STEPS, bounded
from trainer.decoding import SamplingNoise, sample
from trainer.decoders.base import Decoder
from trainer.decoders.hacap import HACap
from trainer.modules.text_discriminator import TextDiscriminator
from trainer.objectives.base import Objective
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig

SETS_KEY, HELDOUT_KEY = 71, 72  # the draws' keys beside (seed, round, ...): D's own streams


@dataclass
class DiscriminatorSchedule:
    """How D is trained, per round; the defaults are LeakGAN's (module docstring)."""

    sets: int = bounded(5, 1, MAX_STEPS)  # fresh sample sets per round
    epochs: int = bounded(3, 1, MAX_STEPS)  # D's epochs over each set
    images: int = bounded(0, 0, MAX_IMAGES)  # train images per set; 0: the whole split
    batch_size: int = bounded(64, 1, MAX_BATCH * MAX_SAMPLES)  # sentences per D step
    lr: float = bounded(5.0e-5, above=0)  # D's Adam
    heldout_images: int = bounded(100, 0, MAX_IMAGES)  # validation images scored per round
    temperature: float = bounded(1.0, above=0)  # of the samples D sees


@contextmanager
def dropout_off(module: torch.nn.Module):
    """``module`` in evaluation mode (no dropout) inside the block, as it was after it."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def with_bos(tokens: Tensor) -> Tensor:
    """Decoded rows [N, T] -> caption rows [N, T+1] that start with ``<bos>`` (what D reads)."""
    return F.pad(tokens, (1, 0), value=BOS_ID)


def global_token_rows(local: Tensor, share, per_image: int, width: int) -> Tensor:
    """This rank's token rows (at most ``width`` wide) placed at its images' rows of the global
    batch [images x per_image, width], summed over the ranks: every rank ends with the whole
    batch's rows."""
    rows = local.new_full((share.images * per_image, width), PAD_ID)
    if share.weight > 0:
        first = share.first * per_image
        rows[first:first + len(local), :local.shape[1]] = local
    return share.total(rows)


def global_image_rows(pooled: Tensor, share) -> Tensor:
    """This rank's images' pooled features [b, F] placed at its images' rows of the global
    batch [images, F], summed over the ranks: every rank ends with the whole batch's."""
    rows = pooled.new_zeros(share.images, pooled.shape[1])
    if share.weight > 0:
        rows[share.first:share.first + len(pooled)] = pooled
    return share.total(rows)


@dataclass
class CaptionSet:
    """What D trains on, or is scored on: references (real) and samples (fake), the global
    token rows [M, W] each, ``per_image`` adjacent rows of each image and row k of both of the
    same image; for a D that reads the image, each image's pooled feature [M / per_image, F]
    (None for a text-only D)."""

    real: Tensor
    fake: Tensor
    images: Tensor | None = None
    per_image: int = 1

    def images_of(self, rows: Tensor) -> Tensor | None:
        """The pooled image [n, F] of the real (or the fake) rows ``rows`` [n]; None without."""
        return None if self.images is None else self.images[rows // self.per_image]


def scored(discriminator: torch.nn.Module, tokens: Tensor, images: Tensor | None) -> Tensor:
    """D's logits of token rows, with their pooled images when the set has them."""
    return discriminator(tokens) if images is None else discriminator(tokens, images)


def drop_pad_columns(tokens: Tensor) -> Tensor:
    """Token rows without their trailing all-``<pad>`` columns (D's cost is per column)."""
    used = int((tokens != PAD_ID).sum(1).max()) if len(tokens) else 0
    return tokens[:, :max(used, 1)]


def rank_part(batch) -> float:
    """This rank's share of a global batch's images (0 for a padding rank): the ranks' parts
    of a figure every rank holds add up to it (statistics are summed over ranks)."""
    share = batch.share
    return len(batch.image_ids) * share.weight / share.images


class DiscriminatorRounds:
    """D's optimiser, its round counter, and what a round does (module docstring)."""

    def __init__(self, schedule: DiscriminatorSchedule, setting, discriminator: TextDiscriminator,
                 scale: Callable[[int], float] | None = None):
        self.schedule, self.setting, self.discriminator = schedule, setting, discriminator
        self.scale = scale  # per step, of the samples' logits (decode.sample); None: unscaled
        self.optimizer = torch.optim.Adam(discriminator.parameters(), lr=schedule.lr)
        self.rounds = 0  # rounds done (checkpointed: the draws of the next one follow from it)

    def state(self) -> dict:
        return {"rounds": self.rounds}

    def load_state(self, state: dict) -> None:
        self.rounds = state.get("rounds", 0)

    # -- a round

    def run(self, decoder: Decoder, seed: int, phase: str, batch) -> dict:
        """One round: ``sets`` fresh sets, ``epochs`` D epochs each, then the held-out score.
        Logs the round's entry and returns its figures for the statistics of the step
        (``batch``: this rank's part of it), as this rank's part of them."""
        started = time.perf_counter()
        losses = []
        for index in range(self.schedule.sets):
            drawn = self.draw_set(decoder, seed, index)
            losses += self.train_on(drawn, np.random.default_rng(
                [seed, SETS_KEY, self.rounds, index, 1]))
        trained_at = time.perf_counter()
        heldout = self.heldout_scores(decoder, seed)
        self.rounds += 1
        figures = {"round": self.rounds, "phase": phase,
                   "d_loss": float(np.mean(losses)) if losses else float("nan"), **heldout,
                   "time_d_train": trained_at - started,
                   "time_d_heldout": time.perf_counter() - trained_at}
        self.setting.log({"kind": "discriminator", **figures})
        part = rank_part(batch)  # every rank has the round's figures: each gives its part
        return {"d_loss": figures["d_loss"] * part,
                "d_heldout_accuracy": heldout.get("heldout_accuracy", float("nan")) * part,
                "time_d_round": time.perf_counter() - started}

    def draw_set(self, decoder: Decoder, seed: int, index: int) -> CaptionSet:
        """A set's references and samples, the global rows [M, W] each, on every rank."""
        train = self.setting.batches("train")
        rng = np.random.default_rng([seed, SETS_KEY, self.rounds, index])
        rows = rng.permutation(train.rows)
        rows = rows[:self.schedule.images] if self.schedule.images else rows
        return self.caption_set(decoder, train, rows, rng, (seed, SETS_KEY, self.rounds, index))

    def caption_set(self, decoder: Decoder, source, rows: np.ndarray, rng: np.random.Generator,
                    key: tuple) -> CaptionSet:
        """For image ``rows`` of ``source`` (a TrainBatches) in chunks of its batch size:
        ``seq_per_img`` references and as many samples of each, all ranks' rows, and the
        images' pooled features when D reads them."""
        real, fake, images = [], [], []
        # as wide as the longer of a reference row and a sample row, the same on every rank: a
        # reference cut short of its <eos> would be a cue that has nothing to do with the text
        per_image = source.seq_per_img
        width = max(int(source.all_captions.shape[1]), self.setting.max_len + 2)
        for chunk, start in enumerate(range(0, len(rows), source.batch_size)):
            batch = source.batch(rows[start:start + source.batch_size], rng).to(self.device)
            share = batch.share
            noise = SamplingNoise((*key, chunk), share.images * per_image,
                                  share.first * per_image)
            with dropout_off(decoder), torch.no_grad():
                ctx = decoder.encode(batch.feats, batch.mask)
                drawn = sample(decoder, ctx, self.setting.max_len, self.schedule.temperature,
                               n=per_image, noise=noise, scale=self.scale).tokens
            real.append(global_token_rows(batch.captions, share, per_image, width))
            fake.append(global_token_rows(with_bos(drawn), share, per_image, width))
            if self.discriminator.reads_image:
                images.append(global_image_rows(ctx["mean"].float(), share))
        return CaptionSet(torch.cat(real), torch.cat(fake),
                          torch.cat(images) if images else None, per_image)

    @property
    def device(self) -> torch.device:
        return next(self.discriminator.parameters()).device

    def train_on(self, drawn: CaptionSet, rng: np.random.Generator) -> list[float]:
        """``epochs`` epochs of D over real (1) and fake (0) rows, in minibatches; the losses."""
        real, fake = drawn.real, drawn.fake
        tokens = torch.cat([real, fake])
        labels = torch.cat([torch.ones(len(real)), torch.zeros(len(fake))]).to(tokens.device)
        losses, size = [], self.schedule.batch_size
        for _ in range(self.schedule.epochs):
            order = torch.as_tensor(rng.permutation(len(tokens)), device=tokens.device)
            for start in range(0, len(order), size):
                picked = order[start:start + size]
                logits = scored(self.discriminator, drop_pad_columns(tokens[picked]),
                                drawn.images_of(picked % len(real)))
                loss = F.binary_cross_entropy_with_logits(logits, labels[picked])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                losses.append(loss.item())
        return losses

    # -- what D learned

    @torch.no_grad()
    def heldout_scores(self, decoder: Decoder, seed: int) -> dict:
        """D on the first ``heldout_images`` validation images' references against fresh
        samples of them: its accuracy and its mean score of each side (none without them)."""
        n = self.schedule.heldout_images
        if not n:
            return {}
        heldout = self.setting.batches("val")
        drawn = self.caption_set(
            decoder, heldout, heldout.rows[:n], np.random.default_rng([seed, HELDOUT_KEY]),
            (seed, HELDOUT_KEY, self.rounds))
        return discrimination(self.discriminator, drawn.real, drawn.fake, self.schedule.batch_size,
                              drawn.images, drawn.per_image)


@torch.no_grad()
def discrimination(discriminator: torch.nn.Module, real: Tensor, fake: Tensor,
                   batch_size: int = 256, images: Tensor | None = None,
                   per_image: int = 1) -> dict:
    """D's accuracy on real rows (should score > 0.5) and fake rows (< 0.5), and its mean
    score of each; with ``images`` (a :class:`CaptionSet`'s: each image's pooled feature,
    ``per_image`` adjacent rows of each in ``real`` and in ``fake``) for a D that reads them."""
    def scores(tokens: Tensor) -> Tensor:
        out = []
        for k in range(0, len(tokens), batch_size):
            part = tokens[k:k + batch_size]
            rows = torch.arange(k, k + len(part), device=tokens.device)
            pooled = None if images is None else images[rows // per_image]
            out.append(torch.sigmoid(scored(discriminator, drop_pad_columns(part), pooled)))
        return torch.cat(out)

    on_real, on_fake = scores(real), scores(fake)
    right = (on_real > 0.5).sum() + (on_fake < 0.5).sum()
    return {"heldout_accuracy": float(right) / (len(real) + len(fake)),
            "heldout_real": float(on_real.mean()), "heldout_fake": float(on_fake.mean())}


class TrainsDiscriminator(Objective[HACap]):
    """An objective that trains HACap's D in rounds beside the generator's steps (both of
    HACap's phases): it makes the rounds from its config's ``discriminator`` schedule when
    bound, counts the generator's steps, keeps maximum likelihood at hand, and saves all of it
    with the run."""

    def __init__(self, config, setting) -> None:
        super().__init__(config, setting)
        self.ml = CrossEntropy(CrossEntropyConfig(), setting)
        self.steps = 0  # the generator's steps so far (checkpointed: the schedule resumes)
        self.rounds: DiscriminatorRounds | None = None

    def bind(self, decoder: HACap) -> None:
        self.rounds = DiscriminatorRounds(self.config.discriminator, self.setting,
                                          decoder.discriminator, self.negatives_scale())

    def negatives_scale(self) -> Callable[[int], float] | None:
        """The per-step scale of the logits of D's samples (decode.sample); None: unscaled."""
        return None

    def optimizers(self) -> dict:
        assert self.rounds is not None, "bind() makes the rounds"
        return {"discriminator": self.rounds.optimizer}

    def extra_state(self) -> dict:
        assert self.rounds is not None, "bind() makes the rounds"
        return {"steps": self.steps, **self.rounds.state()}

    def load_extra_state(self, state: dict) -> None:
        self.steps = state.get("steps", 0)
        assert self.rounds is not None, "bind() makes the rounds"
        self.rounds.load_state(state)


__all__ = ["CaptionSet", "DiscriminatorRounds", "DiscriminatorSchedule", "TrainsDiscriminator",
           "discrimination", "dropout_off", "global_image_rows", "global_token_rows", "scored",
           "with_bos"]
