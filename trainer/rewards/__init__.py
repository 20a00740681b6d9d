"""Rewards for reinforcement fine-tuning, found by name: ``reward: {name: bleu, n: 4}``.

A reward scores sampled captions as token ids (trainer/rewards/base.py says what one is).
Each module registers its class with ``@REWARDS.register(name)``; importing this package
imports every module in it, so adding a reward is one new file here. An objective's
``reward: {name: ..., ...}`` is parsed into the reward's ``Config`` when the experiment
file is read (trainer/config.py), and built with the prepared captions when the objective
is (:func:`build_reward`).
"""

from __future__ import annotations

from pipeline.core.registry import Registry, import_modules

REWARDS = Registry("reward")


def build_reward(name: str, config, captions) -> "Reward":
    """The registered reward ``name`` built from its (already checked) config dataclass and
    the prepared captions trained on (``Setting.captions``)."""
    return REWARDS.get(name)(config, captions)


from trainer.rewards.base import Reward  # noqa: E402

import_modules(__name__, __path__)  # each registers itself (a mix builds others)

__all__ = ["REWARDS", "Reward", "build_reward"]
