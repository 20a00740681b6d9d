"""Self-critical sequence training (Rennie et al.; eq. 11 of the bottom-up/top-down replication).

    grad L(theta) ~ -(r(w^s) - b) grad log p(w^s)

with ``w^s`` multinomial samples of the current model, ``r`` the reward (a
registered one, trainer/rewards/: CIDEr-D against the cached training
references, BLEU, ROUGE-L, METEOR or a weighted mix), and the baseline ``b``
either the reward of the model's own greedy decode (``baseline="greedy"``) or,
with several samples per image, the mean reward of the image's *other* samples
(``"mean"``; the greedy decode is then skipped). It is ``decode.sample`` + a
reward + this loss.

An experiment asks for it with ``objective: {name: scst, reward: {name: cider-d,
cache: FILE}, samples: 5, baseline: greedy}``, usually after cross-entropy
(``train.init_from``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from pipeline.captions.vocab import EOS_ID
from trainer.batch import Share
from trainer.bounds import MAX_SAMPLES, bounded
from trainer.components import Component, component
from trainer.decoding import greedy, sample
from trainer.decoders.base import Decoder
from trainer.objectives import OBJECTIVES
from trainer.objectives.base import StepKey
from trainer.objectives.rewarded import RewardedObjective
from trainer.rewards import REWARDS


def words_and_lengths(tokens: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Decoded ids [N, T] (<eos> then <pad>) -> word ids [N, T] zeroed from <eos>, word counts."""
    ids = tokens.detach().cpu().numpy()
    ended = ids == EOS_ID
    lengths = np.where(ended.any(1), ended.argmax(1), ids.shape[1])
    words = np.where(np.arange(ids.shape[1])[None, :] < lengths[:, None], ids, 0)
    return words, lengths


def generated_mask(tokens: Tensor) -> Tensor:
    """[N, T] True for each generated token up to and including the first <eos>."""
    ended_before = torch.cumsum((tokens == EOS_ID).long(), 1) - (tokens == EOS_ID).long()
    return ended_before == 0


def drawn_mask(tokens: Tensor, max_len: int) -> Tensor:
    """[N, T] True for each token the policy drew: every generated token up to and including
    the first <eos>, except an <eos> forced after ``max_len`` words. Decoding allows only
    <eos> there (trainer/decoding/words.py ``ending_at``) and records the model's log P(<eos>); that
    word was never drawn, so a policy gradient through it would push P(<eos>) down after every
    run-on caption with a negative advantage."""
    drawn = generated_mask(tokens)
    drawn[:, max_len:] = False
    return drawn


def mean_of_others(rewards: np.ndarray) -> np.ndarray:
    """[B, S] -> each sample's baseline: the mean reward of the image's other samples."""
    s = rewards.shape[1]
    if s < 2:
        raise ValueError("the mean of the other samples needs at least 2 samples per image")
    return (rewards.sum(1, keepdims=True) - rewards) / (s - 1)


def scst_loss(logprobs: Tensor, mask: Tensor, advantage: Tensor,
              share: Share | None = None) -> Tensor:
    """-(r - b) log p(w^s), per generated token, averaged over the generated tokens
    (of the global batch, with a ``share``; trainer/batch.py)."""
    weighted = -advantage[:, None] * logprobs * mask
    tokens = mask.sum() if share is None else share.global_count(mask.sum())
    return weighted.sum() / tokens.clamp(min=1)


def mean_part(values: np.ndarray, per_image: int, share: Share | None) -> float:
    """This rank's part of the global batch's mean of a per-sample value ([B, per_image] or
    [B * per_image]): the parts of all ranks add up to the mean."""
    if share is None:
        return float(values.mean())
    return float(values.sum()) * share.weight / (share.images * per_image)


def greedy_decode(decoder: Decoder, feats: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """The decoder's greedy captions [B, T], in evaluation mode (no dropout), without gradients."""
    with torch.no_grad():
        was_training = decoder.training
        decoder.eval()
        tokens = greedy(decoder, decoder.encode(feats, mask), max_len).tokens
        decoder.train(was_training)
    return tokens


@dataclass
class SelfCriticalConfig:
    reward: Component = component(REWARDS)  # e.g. {name: cider-d, cache: data/cider/train.npz}
    samples: int = bounded(5, 1, MAX_SAMPLES)  # sampled captions per image
    baseline: Literal["greedy", "mean"] = "greedy"  # mean: of the image's other samples
    temperature: float = bounded(1.0, above=0)

    def check(self):
        if self.baseline == "mean" and self.samples < 2:
            yield (f"baseline: 'mean' (of the image's other samples) needs samples >= 2, "
                   f"got {self.samples}")


@OBJECTIVES.register("scst")
class SelfCritical(RewardedObjective):
    """Self-critical sequence training: CIDEr-D of samples against the greedy one (or the mean)."""

    Config = SelfCriticalConfig
    label = "SCST"
    family = "reinforcement"

    def leaves_parameters_out(self, decoder: Decoder) -> bool:
        return not decoder.sampled_log_probs_train_all  # HACap, Stack-Cap: see the decoders

    def loss(self, decoder: Decoder, batch, key: StepKey) -> tuple[Tensor, dict]:
        started = time.perf_counter()
        s, feats, mask = self.config.samples, batch.feats, batch.mask
        drawn = sample(decoder, decoder.encode(feats, mask), self.setting.max_len,
                       self.config.temperature, n=s, noise=key.sampling_noise(batch.share, s))
        greedy_words = None
        if self.config.baseline == "greedy":
            greedy_words = greedy_decode(decoder, feats, mask, self.setting.max_len)
        sampled_at = time.perf_counter()
        ids = np.repeat(np.asarray(batch.image_ids), s)
        rewards, parts = self.score_parts(ids, *words_and_lengths(drawn.tokens))
        rewards = rewards.reshape(-1, s)
        stats = {f"reward_{name}": mean_part(part, s, batch.share) for name, part in parts.items()}
        if greedy_words is None:
            base = mean_of_others(rewards)
        else:
            greedy, parts = self.score_parts(batch.image_ids, *words_and_lengths(greedy_words))
            base = np.repeat(greedy, s).reshape(-1, s)
            stats.update({f"baseline_{name}": mean_part(part, 1, batch.share)
                          for name, part in parts.items()})
        scored_at = time.perf_counter()
        advantage = torch.as_tensor((rewards - base).reshape(-1), dtype=torch.float32,
                                    device=drawn.logprobs.device)
        share = batch.share
        loss = scst_loss(drawn.logprobs, drawn_mask(drawn.tokens, self.setting.max_len),
                         advantage, share)
        return loss, {"reward": mean_part(rewards, s, share),
                      "baseline": mean_part(base, s, share), **stats,
                      "time_sample": sampled_at - started, "time_reward": scored_at - sampled_at}
