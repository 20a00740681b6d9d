"""Stack-Cap's coarse-to-fine reinforcement learning (eqs 11-15).

For every fine stage i >= 1, with w^s_i a caption sampled with stage i as the
head and w-hat_i its greedy decode,

    delta r(w^s_i) = r(w^s_i) - r(w-hat_i) + r(w^s_i) - r(w^s_{i-1})      eq 15
    grad ~ sum_{i>=1} -delta r(w^s_i) grad_{theta_0:i} log p_{0:i}(w^s_i)  eq 14

The coarse stage (i = 0) has no term of its own (eq 11 starts at i = 1); it
learns through the fine stages' theta_{0:i}. ``coarse_term`` adds a plain
self-critical term for it (off by default).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pipeline.core.errors import CapstackError
from trainer.decode import SamplingNoise, greedy, sample
from trainer.decoders.base import Decoder
from trainer.objectives.scst import generated_mask, mean_part, scst_loss, words_and_lengths
from trainer.objectives.share import Share


def c2f_advantages(sampled: np.ndarray, greedy_rewards: np.ndarray) -> np.ndarray:
    """Eq 15 for stages 1..Nf: [stages, N] rewards of samples and greedy decodes -> [stages-1, N]."""
    return 2 * sampled[1:] - greedy_rewards[1:] - sampled[:-1]


@dataclass
class CoarseToFine:
    scorer: object  # CiderD (anything with score(image_ids, words, lengths))
    samples: int = 1
    max_len: int = 16
    coarse_term: bool = False

    def loss(self, model: Decoder, feats: Tensor, mask: Tensor, image_ids: list[int],
             share: Share | None = None, noise: SamplingNoise | None = None) -> tuple[Tensor, dict]:
        if not hasattr(model, "heading"):
            raise CapstackError(f"train.objective c2f needs a coarse-to-fine decoder "
                                f"(stack_cap, stack_cap_star), got {type(model).__name__}")
        started = time.perf_counter()
        ids = np.repeat(np.asarray(image_ids), self.samples)
        drawn, greedy_tokens = [], []
        for stage in range(model.stages):
            with model.heading(stage):
                drawn.append(sample(model, model.encode(feats, mask), self.max_len,
                                    n=self.samples, noise=noise and noise.child(stage)))
                with torch.no_grad():
                    was_training = model.training
                    model.eval()
                    decoded = greedy(model, model.encode(feats, mask), self.max_len).tokens
                    model.train(was_training)
                greedy_tokens.append(np.repeat(decoded.cpu().numpy(), self.samples, axis=0))
        sampled_at = time.perf_counter()
        r_sample = np.stack([self.scorer.score(ids, *words_and_lengths(d.tokens)) for d in drawn])
        r_greedy = np.stack([self.scorer.score(ids, *words_and_lengths(torch.from_numpy(g)))
                             for g in greedy_tokens])
        advantages = c2f_advantages(r_sample, r_greedy)  # [Nf, N]
        scored_at = time.perf_counter()
        terms = [(drawn[i], advantages[i - 1]) for i in range(1, model.stages)]
        if self.coarse_term:
            terms.append((drawn[0], r_sample[0] - r_greedy[0]))
        device = drawn[0].logprobs.device
        loss = torch.stack([scst_loss(d.logprobs, generated_mask(d.tokens),
                                      torch.as_tensor(a, dtype=torch.float32, device=device), share)
                            for d, a in terms]).sum()
        s = self.samples
        stats = {"reward": mean_part(r_sample[-1], s, share),
                 "baseline": mean_part(r_greedy[-1], s, share),
                 "time_sample": sampled_at - started, "time_reward": scored_at - sampled_at}
        stats.update({f"reward_stage{i}": mean_part(r_sample[i], s, share)
                      for i in range(model.stages)})
        return loss, stats
