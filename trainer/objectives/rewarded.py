"""An objective that scores samples with a registered reward (SCST, C2F): it builds the reward
its config names, and lets go of it when training ends (METEOR's Java process)."""

from __future__ import annotations

import numpy as np

from trainer.objectives.base import DecoderT, Objective, Setting
from trainer.rewards import Reward, build_reward


class RewardedObjective(Objective[DecoderT]):
    """Subclasses' configs have a ``reward`` component."""

    def __init__(self, config, setting: Setting, scorer: Reward | None = None):
        """``scorer``: a reward to use rather than building ``config.reward`` (tests,
        benchmarks); the caller keeps it, and closes it."""
        super().__init__(config, setting)
        self.owns_scorer = scorer is None
        self.scorer = scorer or build_reward(config.reward.name, config.reward.config,
                                             setting.captions)

    def close(self) -> None:
        if self.owns_scorer:
            self.scorer.close()

    def score_parts(self, image_ids, tokens: np.ndarray,
                    lengths: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each caption's reward and, for a reward of parts (a mix), each part's by name
        (:meth:`Reward.score_parts`); a bare scorer given to the objective only scores."""
        if isinstance(self.scorer, Reward):
            return self.scorer.score_parts(image_ids, tokens, lengths)
        return self.scorer.score(image_ids, tokens, lengths), {}
