"""HACap's adversarial training: LeakGAN's procedure (Guo et al.), which the paper builds on.

The paper names the method and gives no schedule; capstack takes LeakGAN's
own code (CR-Gjx/LeakGAN, ``Image COCO/Main.py``). It starts from the
maximum-likelihood phase (``interleaved_pretraining``: the generator's MLE with
D trained alongside, so D separates real from generated text and the MANAGER
has learned D's features). A run with ``objective: {name: adversarial}`` then
repeats:

1. **An adversarial batch.** The generator samples captions; every c words,
   Q_t is the mean D score of ``rollouts`` Monte-Carlo completions of the
   prefix (the whole caption's score for the last segment); each segment's Q
   is rescaled by its rank in the (global) batch, sigmoid(delta (rank/B -
   0.5)) (:func:`rank_rewards`). The MANAGER minimises
   -sum_t Q_t cos(f_{t+c} - f_t, g_t) on the sample's own f, the WORKER
   -sum_t r^I_t log p(y_t) with the intrinsic reward
   r^I_t = (1/c) sum_i cos(f_t - f_{t-i}, g_{t-i}).
2. **A D round** after every ``discriminator_every`` adversarial batches
   (LeakGAN: every one): ``discriminator.sets`` fresh sample sets, D's
   ``discriminator.epochs`` epochs over each (trainer/objectives/
   discriminator_rounds.py), its held-out accuracy logged.
3. **A maximum-likelihood interlude** of ``ml_batches`` batches after every
   ``ml_every`` (15) adversarial batches. LeakGAN's is one ``pre_train_epoch``,
   a twentieth of an epoch (``ml_batches: 0``). It keeps the captions grounded,
   since D never sees the image.

**One policy.** Dropout is off for everything the generator's update reads:
the samples, the rollouts, and the teacher-forced pass that recomputes log p,
the goals and the features of the samples. So the log p that is reinforced is
that of the policy that drew the samples (LeakGAN's generator runs with
``drop_out: 1.0`` both when generating and when updating). The interludes'
maximum-likelihood steps keep the run's dropout.

D is a part of the decoder (decoding reads its features) that this objective
alone trains, with its own Adam, saved and restored with the run. The losses
divide sums by the global batch's counts, as every objective's do
(trainer/batch.py); the rank rescaling ranks the global batch's rewards, and D
trains on the same global sets on every rank, so a run on several processes
trains as one does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from trainer.bounds import MAX_SAMPLES, MAX_STEPS, bounded
from trainer.decode import sample
from trainer.decoders.hacap import HACap, manager_cosines
from trainer.objectives import OBJECTIVES
from trainer.objectives.base import StepKey
from trainer.objectives.discriminator_rounds import (DiscriminatorSchedule, TrainsDiscriminator,
                                                     dropout_off, with_bos)
from trainer.objectives.scst import drawn_mask, generated_mask
from trainer.rewards.intrinsic import intrinsic_rewards

INTERLUDE_PART = 20  # LeakGAN's pre_train_epoch: num_batch / 20 batches


@dataclass
class AdversarialConfig:
    samples: int = bounded(1, 1, MAX_SAMPLES)  # sampled captions per image, generator's update
    rollouts: int = bounded(4, 1, MAX_SAMPLES)  # Monte-Carlo completions per prefix
    delta: float = bounded(16.0, 0)  # the rank rescaling's slope
    discriminator: DiscriminatorSchedule = field(default_factory=DiscriminatorSchedule)
    discriminator_every: int = bounded(1, 1, MAX_STEPS)  # adversarial batches between D rounds
    ml_every: int = bounded(15, 1, MAX_STEPS)  # adversarial batches between ML interludes
    ml_batches: int = bounded(0, 0, MAX_STEPS)  # batches of an interlude; 0: an epoch / 20
    temperature: float = bounded(1.0, above=0)
    # what the rewards are measured against: "none", LeakGAN's (every Q and r^I in use is
    # positive: each sample's words are reinforced), or "mean", the global batch's mean Q per
    # segment and mean r^I per word (REINFORCE with a baseline: the same expected gradient)
    baseline: Literal["none", "mean"] = "none"


def rank_rewards(rewards: Tensor, delta: float) -> Tensor:
    """Per column of rewards [B, S], sigmoid(delta (rank/B - 0.5)) with rank 1..B ascending
    (ties in row order): in (0, 1), monotone in the reward, a function of the ranks alone."""
    b = rewards.shape[0]
    ranks = rewards.argsort(dim=0, stable=True).argsort(dim=0, stable=True).to(rewards.dtype) + 1
    return torch.sigmoid(delta * (ranks / b - 0.5))


def minus_mean(rewards: Tensor, mask: Tensor, share, count: Tensor) -> Tensor:
    """Per-word rewards [N, T] less their mean over the global batch's ``count`` generated words
    (``mask``): REINFORCE's baseline, the same on every rank."""
    return rewards - share.total((rewards * mask).sum() * share.weight) / count


class Phase:
    """Which kind of step the objective's step counter is at."""

    ADVERSARIAL, ML = "adversarial", "ml"


@OBJECTIVES.register("adversarial")
class Adversarial(TrainsDiscriminator):
    """HACap's adversarial phase (LeakGAN): rollouts scored by D, D's rounds, ML interludes."""

    Config = AdversarialConfig
    label = "Adv"
    family = "adversarial"
    decoder_type = HACap

    # -- the schedule

    def interlude_batches(self) -> int:
        return self.config.ml_batches or max(1, self.setting.epoch_batches // INTERLUDE_PART)

    def cycle_position(self) -> tuple[int, int]:
        """(cycles done, position in the current one); a cycle is ``ml_every`` adversarial
        batches, then the maximum-likelihood interlude."""
        return divmod(self.steps, self.config.ml_every + self.interlude_batches())

    def phase(self) -> str:
        return Phase.ADVERSARIAL if self.cycle_position()[1] < self.config.ml_every else Phase.ML

    def adversarial_steps(self) -> int:
        """Adversarial batches before this step (D's rounds count them)."""
        cycles, position = self.cycle_position()
        return cycles * self.config.ml_every + min(position, self.config.ml_every)

    # -- the generator's loss

    def loss(self, decoder: HACap, batch, key: StepKey) -> tuple[Tensor, dict]:
        if self.phase() != Phase.ADVERSARIAL:  # the generator follows D by maximum likelihood
            loss, stats = self.ml.loss(decoder, batch, key)
            return loss, {**stats, "ml": batch.share.weight}
        with dropout_off(decoder):  # one policy: what drew the samples is what is scored
            return self.adversarial_loss(decoder, batch, key)

    def adversarial_loss(self, decoder: HACap, batch, key: StepKey) -> tuple[Tensor, dict]:
        started = time.perf_counter()
        c, share, s = self.config, batch.share, self.config.samples
        ctx = decoder.encode(batch.feats, batch.mask)
        with torch.no_grad():
            tokens = sample(decoder, ctx, self.setting.max_len, c.temperature, n=s,
                            noise=key.sampling_noise(share, s)).tokens
            values = self.rollout_values(decoder, ctx, tokens, key, share)  # [N, segments]
        sampled_at = time.perf_counter()
        first = share.first * s
        ranked = rank_rewards(self.global_rows(values, share, s), c.delta)
        if c.baseline == "mean":
            ranked = ranked - ranked.mean(0, keepdim=True)
        q = ranked[first:first + len(values)]
        horizon = decoder.config.horizon
        q_per_goal = q.repeat_interleave(horizon, 1)[:, :tokens.shape[1]]  # [N, T]
        output = decoder(ctx, with_bos(tokens))
        mask = generated_mask(tokens)  # the caption, for the MANAGER's goals
        drawn = drawn_mask(tokens, self.setting.max_len)  # the words the WORKER drew
        last = mask.sum(1)
        count = share.global_count(mask.sum())
        goals, features = output.extras["goals"], output.extras["features"]
        manager = -(q_per_goal * manager_cosines(features, goals, horizon, last)).sum()
        logp = torch.log_softmax(output.logits.float(), 2).gather(2, tokens[:, :, None]).squeeze(2)
        intrinsic = intrinsic_rewards(features, goals, horizon, last).detach()
        if c.baseline == "mean":
            advantage = minus_mean(intrinsic, drawn, share, share.global_count(drawn.sum()))
        else:
            advantage = intrinsic
        worker = -(advantage * logp * drawn).sum()
        loss = (manager + worker) / count
        weight = share.weight / (share.images * s)
        return loss, {"d_sample": float(values[:, -1].sum()) * weight,
                      "intrinsic": float((intrinsic * mask).sum()) * share.weight / float(count),
                      "time_sample": sampled_at - started}

    def rollout_values(self, decoder: HACap, ctx, tokens: Tensor, key: StepKey, share) -> Tensor:
        """Q per segment of c words [N, ceil(T/c)]: D's mean score of ``rollouts`` completions
        of each prefix of c, 2c, ... words; the last segment's is the whole sample's score."""
        c, horizon = self.config, decoder.config.horizon
        r, s = c.rollouts, c.samples
        whole = torch.sigmoid(decoder.discriminator(with_bos(tokens)))  # [N]
        values = []
        for end in range(horizon, tokens.shape[1], horizon):
            noise = key.sampling_noise(share, s * r, 1, end)
            completed = sample(decoder, ctx, self.setting.max_len, c.temperature, n=r,
                               noise=noise, prefix=tokens[:, :end]).tokens
            scores = torch.sigmoid(decoder.discriminator(with_bos(completed)))
            values.append(scores.view(-1, r).mean(1))
        values.append(whole)
        return torch.stack(values, 1)

    @staticmethod
    def global_rows(values: Tensor, share, per_image: int) -> Tensor:
        """This rank's rows placed in the global batch's (summed over ranks): ranks are global."""
        rows = values.new_zeros(share.images * per_image, values.shape[1])
        rows[share.first * per_image:share.first * per_image + values.shape[0]] = values * (
            share.weight > 0)
        return share.total(rows)

    # -- D's rounds, and the counter

    def after_step(self, decoder: HACap, batch, key: StepKey) -> dict:
        if self.phase() != Phase.ADVERSARIAL:
            stats = self.ml.after_step(decoder, batch, key)
        elif self.adversarial_steps() % self.config.discriminator_every == 0:
            assert self.rounds is not None, "bind() makes the rounds"
            stats = self.rounds.run(decoder, key.seed, "adversarial", batch)
        else:
            stats = {}
        self.steps += 1
        return stats


__all__ = ["Adversarial", "AdversarialConfig", "minus_mean", "rank_rewards"]
