"""HACap's adversarial training: LeakGAN's procedure (Guo et al.), which the paper builds on.

The paper names the method and gives no schedule; capstack's HACap issue fills
it with LeakGAN's. After maximum likelihood (the ``xe`` objective, which trains
the WORKER on -log P(y|x) and the MANAGER on the real captions' directions),
a run with ``objective: {name: adversarial}`` goes, step by step:

1. **Discriminator pre-training** (``discriminator_pretrain`` steps): D
   learns by binary cross-entropy of the batch's references (real) against
   the generator's samples (fake), while the generator takes
   maximum-likelihood steps. The generator reads D's features (the MANAGER's
   input), so a D that learned alone would move them under a generator
   trained on the old ones: on the demo, 160 D-only steps at lr 1e-3 took
   validation CIDEr from 0.425 to 0.012. LeakGAN interleaves the two
   pre-trainings for the same reason.
2. **Adversarial cycles**: ``ml_every`` adversarial batches, then
   ``ml_batches`` maximum-likelihood batches (one epoch by default) that keep
   the captions grounded, since D never sees the image. An adversarial batch:

   - samples captions; every c words, Q_t is the mean D score of ``rollouts``
     Monte-Carlo completions of the prefix (the whole caption's score for the
     last segment);
   - rescales each segment's Q by its rank in the (global) batch,
     sigmoid(delta (rank/B - 0.5)) (:func:`rank_rewards`);
   - MANAGER: -sum_t Q_t cos(f_{t+c} - f_t, g_t), on the sample's own f;
   - WORKER: -sum_t r^I_t log p(y_t), with the intrinsic reward
     r^I_t = (1/c) sum_i cos(f_t - f_{t-i}, g_{t-i}) (LeakGAN's);
   - then D takes ``discriminator_steps`` steps on fresh samples every
     ``discriminator_every`` adversarial batches.

D is a part of the decoder (decoding reads its features) that this objective
alone trains, with its own Adam (:meth:`Adversarial.bind`), saved and restored
with the run. Under DDP its gradients are summed over the ranks here (the
run's DDP leaves it out). The losses divide sums by the global batch's counts,
as every objective's do (trainer/batch.py); the rank rescaling ranks the
global batch's rewards, so a run on several processes trains as one does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.captions.vocab import BOS_ID
from trainer.bounds import MAX_SAMPLES, MAX_STEPS, bounded
from trainer.decode import sample
from trainer.decoders.base import Decoder, expand_context
from trainer.decoders.hacap import HACap, manager_cosines
from trainer.objectives import OBJECTIVES
from trainer.objectives.base import Objective, Setting, StepKey
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig
from trainer.objectives.scst import generated_mask
from trainer.rewards.intrinsic import intrinsic_rewards


@dataclass
class AdversarialConfig:
    samples: int = bounded(1, 1, MAX_SAMPLES)  # sampled captions per image, generator's update
    rollouts: int = bounded(4, 1, MAX_SAMPLES)  # Monte-Carlo completions per prefix
    delta: float = bounded(16.0, 0)  # the rank rescaling's slope
    discriminator_lr: float = bounded(1.0e-4, above=0)
    discriminator_pretrain: int = bounded(100, 0, MAX_STEPS)  # D-only steps before G's first
    discriminator_every: int = bounded(1, 1, MAX_STEPS)  # adversarial batches between D's turns
    discriminator_steps: int = bounded(1, 1, MAX_STEPS)  # D's steps per turn, on fresh samples
    ml_every: int = bounded(15, 1, MAX_STEPS)  # adversarial batches between ML interludes
    ml_batches: int = bounded(0, 0, MAX_STEPS)  # batches of an interlude; 0: a train epoch
    temperature: float = bounded(1.0, above=0)


def rank_rewards(rewards: Tensor, delta: float) -> Tensor:
    """Per column of rewards [B, S], sigmoid(delta (rank/B - 0.5)) with rank 1..B ascending
    (ties in row order): in (0, 1), monotone in the reward, a function of the ranks alone."""
    b = rewards.shape[0]
    ranks = rewards.argsort(dim=0, stable=True).argsort(dim=0, stable=True).to(rewards.dtype) + 1
    return torch.sigmoid(delta * (ranks / b - 0.5))


def with_bos(tokens: Tensor) -> Tensor:
    """Decoded rows [N, T] -> caption rows [N, T+1] that start with ``<bos>`` (what D reads)."""
    return F.pad(tokens, (1, 0), value=BOS_ID)


class Phase:
    """Which kind of step the objective's step counter is at."""

    PRETRAIN, ADVERSARIAL, ML = "discriminator", "adversarial", "ml"


@OBJECTIVES.register("adversarial")
class Adversarial(Objective):
    """HACap's adversarial phase (LeakGAN): D pre-training, rollouts scored by D, MANAGER and
    WORKER updates, D's own schedule, maximum-likelihood interludes."""

    Config = AdversarialConfig
    label = "Adv"
    family = "adversarial"
    decoder_type = HACap

    def __init__(self, config: AdversarialConfig, setting: Setting):
        super().__init__(config, setting)
        self.ml = CrossEntropy(CrossEntropyConfig(), setting)
        self.steps = 0  # this objective's steps so far (checkpointed: the schedule resumes)
        self.optimizer: torch.optim.Optimizer | None = None
        self.discriminator = None

    # -- what it owns

    def bind(self, decoder: Decoder) -> None:
        self.discriminator = decoder.discriminator
        self.optimizer = torch.optim.Adam(self.discriminator.parameters(),
                                          lr=self.config.discriminator_lr)

    def optimizers(self) -> dict:
        return {"discriminator": self.optimizer}

    def extra_state(self) -> dict:
        return {"steps": self.steps}

    def load_extra_state(self, state: dict) -> None:
        self.steps = state.get("steps", 0)

    # -- the schedule

    def cycle_position(self) -> tuple[int, int]:
        """(cycles done, position in the current one) of the steps after D's pre-training; a
        cycle is ``ml_every`` adversarial batches, then the maximum-likelihood interlude."""
        c = self.config
        ml_batches = c.ml_batches or self.setting.epoch_batches
        return divmod(max(self.steps - c.discriminator_pretrain, 0), c.ml_every + ml_batches)

    def phase(self) -> str:
        if self.steps < self.config.discriminator_pretrain:
            return Phase.PRETRAIN
        return Phase.ADVERSARIAL if self.cycle_position()[1] < self.config.ml_every else Phase.ML

    def adversarial_steps(self) -> int:
        """Adversarial batches so far (D's turns count them)."""
        cycles, position = self.cycle_position()
        return cycles * self.config.ml_every + min(position, self.config.ml_every)

    # -- the generator's loss

    def loss(self, decoder: HACap, batch, key: StepKey) -> tuple[Tensor, dict]:
        if self.phase() != Phase.ADVERSARIAL:  # the generator follows D by maximum likelihood
            loss, stats = self.ml.loss(decoder, batch, key)
            return loss, {**stats, "ml": batch.share.weight}
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
        q = rank_rewards(self.global_rows(values, share, s), c.delta)[first:first + len(values)]
        horizon = decoder.config.horizon
        q_per_goal = q.repeat_interleave(horizon, 1)[:, :tokens.shape[1]]  # [N, T]
        output = decoder(expand_context(ctx, s), with_bos(tokens))
        mask = generated_mask(tokens)
        last = mask.sum(1)
        goals, features = output.extras["goals"], output.extras["features"]
        manager = -(q_per_goal * manager_cosines(features, goals, horizon, last)).sum()
        logp = torch.log_softmax(output.logits.float(), 2).gather(2, tokens[:, :, None]).squeeze(2)
        intrinsic = intrinsic_rewards(features, goals, horizon, last).detach()
        worker = -(intrinsic * logp * mask).sum()
        count = share.global_count(mask.sum())
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
        image_ctx = expand_context(ctx, s)
        values = []
        for end in range(horizon, tokens.shape[1], horizon):
            noise = key.sampling_noise(share, s * r, 1, end)
            completed = sample(decoder, image_ctx, self.setting.max_len, c.temperature, n=r,
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

    # -- D's own steps, and the counter

    def after_step(self, decoder: HACap, batch, key: StepKey) -> dict:
        phase = self.phase()
        stats = self.ml.after_step(decoder, batch, key) if phase != Phase.ADVERSARIAL else {}
        if self.discriminator_turn(phase):
            for turn in range(self.config.discriminator_steps):
                stats = {**stats, **self.discriminator_step(decoder, batch, key, turn)}
        self.steps += 1
        return stats

    def discriminator_turn(self, phase: str) -> bool:
        """Whether D steps now: at every pre-training step, and after every
        ``discriminator_every``-th adversarial batch."""
        if phase == Phase.PRETRAIN:
            return True
        return (phase == Phase.ADVERSARIAL
                and self.adversarial_steps() % self.config.discriminator_every == 0)

    def discriminator_step(self, decoder: HACap, batch, key: StepKey, turn: int) -> dict:
        """One Adam step of D: the batch's references (real) against fresh samples (fake)."""
        share, per_image = batch.share, batch.seq_per_img
        with torch.no_grad():
            fake = sample(decoder, decoder.encode(batch.feats, batch.mask), self.setting.max_len,
                          self.config.temperature, n=per_image,
                          noise=key.sampling_noise(share, per_image, 2, turn)).tokens
        real_logits = self.discriminator(batch.captions)  # [N]
        fake_logits = self.discriminator(with_bos(fake))
        ones, zeros = torch.ones_like(real_logits), torch.zeros_like(fake_logits)
        count = 2 * share.captions
        loss = (F.binary_cross_entropy_with_logits(real_logits, ones, reduction="sum")
                + F.binary_cross_entropy_with_logits(fake_logits, zeros, reduction="sum")) / count
        self.optimizer.zero_grad(set_to_none=True)
        (loss * share.weight).backward()
        self.sum_gradients(share)
        self.optimizer.step()
        w = share.weight / share.captions
        return {"d_loss": loss.item() * share.weight,
                "d_real": float(torch.sigmoid(real_logits.detach()).sum()) * w,
                "d_fake": float(torch.sigmoid(fake_logits.detach()).sum()) * w}

    def sum_gradients(self, share) -> None:
        """D's gradients summed over the ranks (each rank's loss is its part of the global
        mean), in one reduction; in one process, as they are."""
        grads = [p.grad for p in self.discriminator.parameters() if p.grad is not None]
        flat = share.total(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


__all__ = ["Adversarial", "AdversarialConfig", "rank_rewards"]