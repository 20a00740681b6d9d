"""HACap's maximum likelihood with its discriminator learning alongside (LeakGAN's pre-training).

HACap's MANAGER reads the leaked features of D and learns to point where real
captions go in D's feature space. Were D trained only in the adversarial
phase, the MANAGER would learn the feature space of a random network, and
nothing would leak. LeakGAN (``Image COCO/Main.py``) therefore pre-trains the
two together: a D round (trainer/objectives/discriminator_rounds.py), then
``PRE_EPOCH_NUM / 16`` = 12 generator "epochs" of ``num_batch / 20`` batches
(0.6 of an epoch) of maximum likelihood, and again. Here the generator's steps
are the run's cross-entropy steps (the ``xe`` objective's loss, the MANAGER's
term included), and a D round runs every ``round_every`` epochs of them, the
first after the first batch.

An experiment asks for it with ``objective: {name: interleaved_pretraining}``;
the tables count it as cross-entropy training (its row is HACap's XE row).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from trainer.bounds import bounded
from trainer.decoders.hacap import HACap
from trainer.objectives import OBJECTIVES
from trainer.objectives.base import StepKey
from trainer.objectives.discriminator_rounds import DiscriminatorSchedule, TrainsDiscriminator


@dataclass
class InterleavedPretrainingConfig:
    discriminator: DiscriminatorSchedule = field(default_factory=DiscriminatorSchedule)
    round_every: float = bounded(0.6, above=0)  # epochs of generator MLE between D rounds


def batches_between(epochs: float, epoch_batches: int) -> int:
    """``epochs`` of an epoch of ``epoch_batches`` batches, in whole batches (at least one)."""
    return max(1, round(epochs * epoch_batches))


@OBJECTIVES.register("interleaved_pretraining")
class InterleavedPretraining(TrainsDiscriminator):
    """HACap's maximum likelihood, with D's rounds alongside (LeakGAN's pre-training)."""

    Config = InterleavedPretrainingConfig
    label = "XE"
    family = "cross-entropy"
    decoder_type = HACap

    def loss(self, decoder: HACap, batch, key: StepKey) -> tuple[Tensor, dict]:
        return self.ml.loss(decoder, batch, key)

    def after_step(self, decoder: HACap, batch, key: StepKey) -> dict:
        stats = self.ml.after_step(decoder, batch, key)
        every = batches_between(self.config.round_every, self.setting.epoch_batches)
        if self.steps % every == 0:
            assert self.rounds is not None, "bind() makes the rounds"
            stats = {**stats, **self.rounds.run(decoder, key.seed, "pretraining", batch)}
        self.steps += 1
        return stats


__all__ = ["InterleavedPretraining", "InterleavedPretrainingConfig", "batches_between"]
