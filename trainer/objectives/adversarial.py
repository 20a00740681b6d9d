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
   r^I_t = (1/c) sum_i cos(f_t - f_{t-i}, g_{t-i}). These are the paper's
   equations (``credit: paper``); for the code's, see below.
2. **A D round** after every ``discriminator_every`` adversarial batches
   (LeakGAN: every one): ``discriminator.sets`` fresh sample sets, D's
   ``discriminator.epochs`` epochs over each (trainer/objectives/
   discriminator_rounds.py), its held-out accuracy logged.
3. **A maximum-likelihood interlude** of ``ml_batches`` batches after every
   ``ml_every`` (15) adversarial batches. LeakGAN's is one ``pre_train_epoch``,
   a twentieth of an epoch (``ml_batches: 0``). It keeps the captions grounded,
   since a text-only D never sees the image (``decoder.discriminator_reads_image``
   gives it the pooled image, a step beyond the paper).

**One policy.** Dropout is off for everything the generator's update reads:
the samples, the rollouts, and the teacher-forced pass that recomputes log p,
the goals and the features of the samples. So the log p that is reinforced is
that of the policy that drew the samples. (LeakGAN's generator has no dropout;
its ``drop_out``, fed 1.0, is D's feature extractor's keep probability. Its
samples are not drawn from the policy it reinforces, though: see below.) The
interludes' maximum-likelihood steps keep the run's dropout.

**``credit: leakgan_code``**: what LeakGAN's released code (``Image COCO/
LeakGANModel.py``, ``Main.py``) does where it differs from its paper; the
default, ``paper``, is the above.

- The WORKER's intrinsic reward is one number, the mean over the global batch's
  generated words of the per-word cosine r^I_t (TF1's ``cosine_distance`` is a
  scalar mean): its loss is -mean(r^I) sum log p(y_t) / words, maximum
  likelihood on its own samples scaled by one number (LeakGANModel.py 280-286).
  A baseline would subtract that number from itself: ``baseline`` must be none.
- The MANAGER's loss is -mean(Q) mean(cos): the rescaled Q's mean over the
  global batch and its segments times the mean over the global batch's goals
  of cos(f_{t+c} - f_t, g_t) (LeakGANModel.py 262-263): no sample's Q weights
  its own cosines.
- Q is not ranked: :func:`position_rewards` (Main.py 89-110, 147), a function
  of the row's place in the batch, in (0, 1/rollouts). Its batch mean is a
  constant, so D's score reaches the generator only through the features f
  that leak to the MANAGER and the WORKER (the rollouts are still drawn and
  scored, as the code does, and their score logged).
- The generator's samples are drawn from softmax(1.5 logits) for the first two
  words and softmax(0.8 logits) from the third on (LeakGANModel.py 119-121,
  ``train > 0``); the rollouts complete them unscaled (356) and the log p
  reinforced is the unscaled model's (197). D's samples in its rounds (and
  the held-out ones it is scored on) are drawn from softmax(1.5 logits) at every
  step (``train == 0``, Main.py 209, 266).

Not reproduced: the code's unmasked padding (its losses count every one of its
32 positions, after the caption's end too) and the real sentences it appends to
the batch before rescaling (``pos_num``, Main.py 115-138); the code's cosines
pair segment-level features with a goal held for c steps, where these are
capstack's per-word cosines (the paper's pairing). What else the code does is
capstack's already: no dropout anywhere, D's Adam at 5e-5.

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
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.core.tokens import PAD_ID
from trainer.bounds import MAX_SAMPLES, MAX_STEPS, bounded
from trainer.decoding import sample
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
    # whose credit assignment: "paper" (LeakGAN's equations: r^I_t per word for the WORKER,
    # each sample's Q_t cos for the MANAGER, Q ranked), "leakgan_code" (its released code's:
    # batch-mean scalars, Q by position, scaled sampling logits; module docstring)
    credit: Literal["paper", "leakgan_code"] = "paper"

    def check(self):
        problem = credit_problem(self)
        if problem:
            yield problem


def credit_problem(config: AdversarialConfig) -> str | None:
    """What is wrong with the config's credit and baseline together, or None."""
    if config.credit == "leakgan_code" and config.baseline != "none":
        return (f"baseline: must be 'none' with credit 'leakgan_code' (its WORKER's reward is "
                f"one batch mean, its MANAGER's Q a function of position), got "
                f"{config.baseline!r}; set objective.baseline=none or objective.credit=paper")
    return None


def code_generation_scale(t: int) -> float:
    """LeakGAN's code's logit scale when it samples for the generator's update
    (LeakGANModel.py 119-121, ``train > 0``): x 1.5 for words 0 and 1, x 0.8 from word 2 on."""
    return 1.5 if t < 2 else 0.8


def code_negatives_scale(t: int) -> float:
    """LeakGAN's code's logit scale for D's samples (``train == 0``): x 1.5 at every step."""
    return 1.5


def rank_rewards(rewards: Tensor, delta: float) -> Tensor:
    """Per column of rewards [B, S], sigmoid(delta (rank/B - 0.5)) with rank 1..B ascending
    (ties in row order): in (0, 1), monotone in the reward, a function of the ranks alone."""
    b = rewards.shape[0]
    ranks = rewards.argsort(dim=0, stable=True).argsort(dim=0, stable=True).to(rewards.dtype) + 1
    return torch.sigmoid(delta * (ranks / b - 0.5))


def position_rewards(rewards: Tensor, delta: float, rollouts: int) -> Tensor:
    """What LeakGAN's code computes in place of :func:`rank_rewards` (``credit: leakgan_code``).

    ``rescale`` (Image COCO/Main.py 89-110) puts a segment's values in a dict as its keys
    and walks the dict, giving the idx-th key visited sigmoid(16 idx/total - 8), idx = 1..total.
    It never sorts: the order is the dict's iteration order, which under Python >= 3.7 is
    insertion order, the row's position in the batch (under the code's Python 2.7, the hash
    table's slot order, as unrelated to the value). Then Q is divided by ``rollout_num``
    (Main.py 147). So row i (1..B) of every column [B, S] gets
    sigmoid(delta (i/B - 0.5)) / rollouts, in (0, 1/rollouts): a function of where the row
    sits in the batch alone. It carries no information about D's score (permuting a column's
    values leaves it as it is), and its batch mean is a constant. Rows of equal value keep a
    value each here (the code's dict would collapse them to one key)."""
    b = rewards.shape[0]
    positions = torch.arange(1, b + 1, dtype=rewards.dtype, device=rewards.device)[:, None]
    return (torch.sigmoid(delta * (positions / b - 0.5)) / rollouts).expand_as(rewards)


def to_global_width(tokens: Tensor, share, max_len: int) -> Tensor:
    """Sampled rows [N, T] padded with ``<pad>`` to the longest T of any rank's samples.

    Sampling stops when a rank's rows have all ended, so ranks hold samples of different
    widths; the rollouts' segments (one per c words) and so the rows of Q that
    :meth:`Adversarial.global_rows` sums over the ranks must have one width on all of them.
    In one process this is the samples' own width."""
    width = tokens.shape[1]
    seen = share.total(F.one_hot(torch.tensor(width, device=tokens.device), max_len + 2).float())
    widest = int(seen.nonzero().max())
    return F.pad(tokens, (0, widest - width), value=PAD_ID)


def batch_mean(rewards: Tensor, mask: Tensor, share, count: Tensor) -> Tensor:
    """The mean of per-word rewards [N, T] over the global batch's ``count`` words (``mask``),
    the same on every rank."""
    return share.total((rewards * mask).sum() * share.weight) / count


def minus_mean(rewards: Tensor, mask: Tensor, share, count: Tensor) -> Tensor:
    """Per-word rewards [N, T] less their mean over the global batch's ``count`` generated words
    (``mask``): REINFORCE's baseline, the same on every rank."""
    return rewards - batch_mean(rewards, mask, share, count)


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

    def __init__(self, config: AdversarialConfig, setting) -> None:
        problem = credit_problem(config)
        if problem:
            raise ValueError(f"objective.{problem}")
        super().__init__(config, setting)

    def negatives_scale(self) -> Callable[[int], float] | None:
        """D's samples as LeakGAN's code draws them under ``credit: leakgan_code``."""
        return code_negatives_scale if self.config.credit == "leakgan_code" else None

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
        code = c.credit == "leakgan_code"
        ctx = decoder.encode(batch.feats, batch.mask)
        with torch.no_grad():
            tokens = sample(decoder, ctx, self.setting.max_len, c.temperature, n=s,
                            noise=key.sampling_noise(share, s),
                            scale=code_generation_scale if code else None).tokens
            tokens = to_global_width(tokens, share, self.setting.max_len)
            values = self.rollout_values(decoder, ctx, tokens, key, share)  # [N, segments]
        sampled_at = time.perf_counter()
        first = share.first * s
        every = self.global_rows(values, share, s)  # the global batch's [images x s, segments]
        if code:
            ranked = position_rewards(every, c.delta, c.rollouts)
        else:
            ranked = rank_rewards(every, c.delta)
        if c.baseline == "mean":
            ranked = ranked - ranked.mean(0, keepdim=True)
        horizon = decoder.config.horizon
        output = decoder(ctx, with_bos(tokens))
        mask = generated_mask(tokens)  # the caption, for the MANAGER's goals
        drawn = drawn_mask(tokens, self.setting.max_len)  # the words the WORKER drew
        last = mask.sum(1)
        count = share.global_count(mask.sum())
        goals, features = output.extras["goals"], output.extras["features"]
        cosines = manager_cosines(features, goals, horizon, last)  # 0 past the caption's end
        logp = torch.log_softmax(output.logits.float(), 2).gather(2, tokens[:, :, None]).squeeze(2)
        intrinsic = intrinsic_rewards(features, goals, horizon, last).detach()
        if code:  # batch means: -mean(Q) mean(cos), -mean(r^I) log p (the ranks' sums / count)
            manager = -(ranked.mean() * cosines).sum()
            advantage = batch_mean(intrinsic, mask, share, count)
        else:
            q = ranked[first:first + len(values)]
            q_per_goal = q.repeat_interleave(horizon, 1)[:, :tokens.shape[1]]  # [N, T]
            manager = -(q_per_goal * cosines).sum()
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
        pooled = ctx["mean"] if decoder.discriminator.reads_image else None

        def score(rows: Tensor, per_image: int) -> Tensor:
            """D's score of decoded rows, ``per_image`` adjacent rows of each of ctx's images."""
            image = None if pooled is None else pooled.repeat_interleave(per_image, 0)
            return torch.sigmoid(decoder.discriminator(with_bos(rows), image))

        whole = score(tokens, s)  # [N]
        values = []
        for end in range(horizon, tokens.shape[1], horizon):
            noise = key.sampling_noise(share, s * r, 1, end)
            completed = sample(decoder, ctx, self.setting.max_len, c.temperature, n=r,
                               noise=noise, prefix=tokens[:, :end]).tokens  # unscaled
            scores = score(completed, s * r)
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


__all__ = ["Adversarial", "AdversarialConfig", "batch_mean", "code_generation_scale",
           "code_negatives_scale", "minus_mean", "position_rewards", "rank_rewards",
           "to_global_width"]
