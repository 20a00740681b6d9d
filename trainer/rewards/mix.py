"""A weighted sum of rewards: ``{name: mix, parts: [{name: cider-d, cache: FILE, weight: 1},
{name: bleu, n: 4, weight: 0.5}]}``.

Each part is a reward's own mapping plus its ``weight``; the mix scores
``sum_i weight_i * part_i`` (self-critical.pytorch's ``cider_reward_weight`` and
``bleu_reward_weight``, for any rewards).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.bounds import bounded
from trainer.components import Component, component
from trainer.rewards import REWARDS, build_reward
from trainer.rewards.base import Reward


@dataclass
class Weight:
    weight: float = bounded(1.0, 0)  # the part's factor in the sum


@dataclass
class MixConfig:
    parts: list[Component] = component(REWARDS, beside=Weight)

    def check(self):
        if not self.parts:
            yield "parts: name at least one reward, each a mapping with its name and weight"
        elif not any(part.beside.weight > 0 for part in self.parts):
            # every sample then scores 0, every advantage is 0: a training at loss 0 that learns
            # nothing, for as many epochs as asked
            yield "parts: every weight is 0, so every caption would score 0 and nothing be " \
                  "learnt; give at least one part a weight above 0"


@REWARDS.register("mix")
class Mix(Reward):
    """A weighted sum of rewards (e.g. CIDEr-D + 0.5 BLEU-4)."""

    Config = MixConfig

    def __init__(self, config: MixConfig, captions):
        super().__init__(config, captions)
        self.parts: list[tuple[float, Reward]] = []
        try:
            for part in config.parts:
                self.parts.append((part.beside.weight,
                                   build_reward(part.name, part.config, captions)))
        except BaseException:
            self.close()
            raise

    def score(self, image_ids, tokens, lengths) -> np.ndarray:
        return self.score_parts(image_ids, tokens, lengths)[0]

    def score_parts(self, image_ids, tokens, lengths) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The weighted sum, and each part's score by its name (``bleu``; a name that repeats
        gets its place in ``parts``: ``bleu_2``)."""
        total, parts = np.zeros(len(tokens)), {}
        names = [part.name for part in self.config.parts]
        for place, (name, (weight, reward)) in enumerate(zip(names, self.parts), 1):
            part = reward.score(image_ids, tokens, lengths)
            parts[name if names.count(name) == 1 else f"{name}_{place}"] = part
            total = total + weight * part
        return total, parts

    def close(self) -> None:
        for _, reward in self.parts:
            reward.close()
