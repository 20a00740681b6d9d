"""Self-critical sequence training (Rennie et al.; eq. 11 of the bottom-up/top-down replication).

    grad L(theta) ~ -(r(w^s) - b) grad log p(w^s)

with ``w^s`` multinomial samples of the current model, ``r`` CIDEr-D against
the cached training references, and the baseline ``b`` either the reward of the
model's own greedy decode (``baseline="greedy"``) or, with several samples per
image, the mean reward of the image's *other* samples (``"mean"``; the greedy
decode is then skipped). It is ``decode.sample`` + ``rewards.cider`` + this loss.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pipeline.core.errors import CapstackError
from pipeline.captions.vocab import EOS_ID
from trainer.decode import SamplingNoise, greedy, sample
from trainer.decoders.base import Decoder
from trainer.rewards.cider import CiderD
from trainer.objectives.share import Share

BASELINES = ("greedy", "mean")


def words_and_lengths(tokens: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Decoded ids [N, T] (<eos> then <pad>) -> word ids [N, T] zeroed from <eos>, word counts."""
    tokens = tokens.detach().cpu().numpy()
    ended = tokens == EOS_ID
    lengths = np.where(ended.any(1), ended.argmax(1), tokens.shape[1])
    words = np.where(np.arange(tokens.shape[1])[None, :] < lengths[:, None], tokens, 0)
    return words, lengths


def generated_mask(tokens: Tensor) -> Tensor:
    """[N, T] True for each generated token up to and including the first <eos>."""
    ended_before = torch.cumsum((tokens == EOS_ID).long(), 1) - (tokens == EOS_ID).long()
    return ended_before == 0


def mean_of_others(rewards: np.ndarray) -> np.ndarray:
    """[B, S] -> each sample's baseline: the mean reward of the image's other samples."""
    s = rewards.shape[1]
    if s < 2:
        raise CapstackError("scst baseline 'mean' needs at least 2 samples per image")
    return (rewards.sum(1, keepdims=True) - rewards) / (s - 1)


def scst_loss(logprobs: Tensor, mask: Tensor, advantage: Tensor,
              share: Share | None = None) -> Tensor:
    """-(r - b) log p(w^s), per generated token, averaged over the generated tokens
    (of the global batch, with a ``share``; trainer/objectives/share.py)."""
    weighted = -advantage[:, None] * logprobs * mask
    tokens = mask.sum() if share is None else share.global_count(mask.sum())
    return weighted.sum() / tokens.clamp(min=1)


def mean_part(values: np.ndarray, per_image: int, share: Share | None) -> float:
    """This rank's part of the global batch's mean of a per-sample value ([B, per_image] or
    [B * per_image]): the parts of all ranks add up to the mean."""
    if share is None:
        return float(values.mean())
    return float(values.sum()) * share.weight / (share.images * per_image)


@dataclass
class SelfCritical:
    scorer: CiderD
    samples: int = 5
    baseline: str = "greedy"
    max_len: int = 16
    temperature: float = 1.0

    def __post_init__(self):
        if self.baseline not in BASELINES:
            raise CapstackError(f"train.scst_baseline: expected one of {', '.join(BASELINES)}, "
                                f"got {self.baseline!r}")
        if self.baseline == "mean" and self.samples < 2:
            raise CapstackError("train.scst_baseline 'mean' needs train.scst_samples >= 2")

    def loss(self, model: Decoder, feats: Tensor, mask: Tensor, image_ids: list[int],
             share: Share | None = None, noise: SamplingNoise | None = None) -> tuple[Tensor, dict]:
        started = time.perf_counter()
        s = self.samples
        drawn = sample(model, model.encode(feats, mask), self.max_len, self.temperature, n=s,
                       noise=noise)
        greedy_words = None
        if self.baseline == "greedy":
            with torch.no_grad():
                was_training = model.training
                model.eval()
                greedy_words = greedy(model, model.encode(feats, mask), self.max_len).tokens
                model.train(was_training)
        sampled_at = time.perf_counter()
        ids = np.repeat(np.asarray(image_ids), s)
        rewards = self.scorer.score(ids, *words_and_lengths(drawn.tokens)).reshape(-1, s)
        if greedy_words is None:
            base = mean_of_others(rewards)
        else:
            base = np.repeat(self.scorer.score(image_ids, *words_and_lengths(greedy_words)),
                             s).reshape(-1, s)
        scored_at = time.perf_counter()
        advantage = torch.as_tensor((rewards - base).reshape(-1), dtype=torch.float32,
                                    device=drawn.logprobs.device)
        loss = scst_loss(drawn.logprobs, generated_mask(drawn.tokens), advantage, share)
        return loss, {"reward": mean_part(rewards, s, share),
                      "baseline": mean_part(base, s, share),
                      "time_sample": sampled_at - started, "time_reward": scored_at - sampled_at}
