"""Stack-Cap's coarse-to-fine reinforcement learning (eqs 11-15).

For every fine stage i >= 1, with w^s_i a caption sampled with stage i as the
head and w-hat_i its greedy decode,

    delta r(w^s_i) = r(w^s_i) - r(w-hat_i) + r(w^s_i) - r(w^s_{i-1})      eq 15
    grad ~ sum_{i>=1} -delta r(w^s_i) grad_{theta_0:i} log p_{0:i}(w^s_i)  eq 14

The coarse stage (i = 0) has no term of its own (eq 11 starts at i = 1); it
learns through the fine stages' theta_{0:i}. ``coarse_term`` adds a plain
self-critical term for it (off by default).

It needs a staged decoder (stack_cap, stack_cap_star), which the experiment
file is checked for when it is read: ``objective: {name: c2f, reward: {name: cider-d,
cache: FILE}}`` (any registered reward, trainer/rewards/).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from trainer.bounds import MAX_SAMPLES, bounded
from trainer.components import Component, component
from trainer.decoding import sample
from trainer.decoders.base import StagedDecoder
from trainer.objectives import OBJECTIVES
from trainer.objectives.base import StepKey
from trainer.objectives.rewarded import RewardedObjective
from trainer.objectives.scst import (drawn_mask, greedy_decode, mean_part, scst_loss,
                                     words_and_lengths)
from trainer.rewards import REWARDS


def c2f_advantages(sampled: np.ndarray, greedy_rewards: np.ndarray) -> np.ndarray:
    """Eq 15 for stages 1..Nf: [stages, N] rewards of samples and greedy decodes ->
    [stages-1, N]."""
    return 2 * sampled[1:] - greedy_rewards[1:] - sampled[:-1]


@dataclass
class CoarseToFineConfig:
    reward: Component = component(REWARDS)  # e.g. {name: cider-d, cache: data/cider/train.npz}
    samples: int = bounded(5, 1, MAX_SAMPLES)  # sampled captions per image and stage
    coarse_term: bool = False  # add a self-critical term for the coarse stage


@OBJECTIVES.register("c2f")
class CoarseToFine(RewardedObjective[StagedDecoder]):
    """Stack-Cap's coarse-to-fine reward: each fine stage against its greedy and the last."""

    Config = CoarseToFineConfig
    label = "C2F"
    family = "reinforcement"
    decoder_type = StagedDecoder

    def leaves_parameters_out(self, decoder: StagedDecoder) -> bool:
        return not self.config.coarse_term  # the coarse stage's output layer is in no term (eq 11)

    def loss(self, decoder: StagedDecoder, batch, key: StepKey) -> tuple[Tensor, dict]:
        started = time.perf_counter()
        s, max_len, share = self.config.samples, self.setting.max_len, batch.share
        noise = key.sampling_noise(share, s)
        ids = np.repeat(np.asarray(batch.image_ids), s)
        drawn, greedy_tokens = [], []
        for stage in range(decoder.stages):
            with decoder.heading(stage):
                drawn.append(sample(decoder, decoder.encode(batch.feats, batch.mask), max_len,
                                    n=s, noise=noise.child(stage)))
                decoded = greedy_decode(decoder, batch.feats, batch.mask, max_len)
                greedy_tokens.append(np.repeat(decoded.cpu().numpy(), s, axis=0))
        sampled_at = time.perf_counter()
        r_sample = np.stack([self.scorer.score(ids, *words_and_lengths(d.tokens)) for d in drawn])
        r_greedy = np.stack([self.scorer.score(ids, *words_and_lengths(torch.from_numpy(g)))
                             for g in greedy_tokens])
        advantages = c2f_advantages(r_sample, r_greedy)  # [Nf, N]
        scored_at = time.perf_counter()
        terms = [(drawn[i], advantages[i - 1]) for i in range(1, decoder.stages)]
        if self.config.coarse_term:
            terms.append((drawn[0], r_sample[0] - r_greedy[0]))
        device = drawn[0].logprobs.device
        loss = torch.stack([scst_loss(d.logprobs, drawn_mask(d.tokens, max_len),
                                      torch.as_tensor(a, dtype=torch.float32, device=device), share)
                            for d, a in terms]).sum()
        stats = {"reward": mean_part(r_sample[-1], s, share),
                 "baseline": mean_part(r_greedy[-1], s, share),
                 "time_sample": sampled_at - started, "time_reward": scored_at - sampled_at}
        stats.update({f"reward_stage{i}": mean_part(r_sample[i], s, share)
                      for i in range(decoder.stages)})
        return loss, stats
