"""Which epoch a run keeps as ``best.pt``, and what epochs without a better one do.

``train.select_on`` names the greedy validation score the kept epoch is best on: CIDEr-D (the
default, as before the setting) or BLEU-4, on which poojahira's bottom-up/top-down keeps its
checkpoint (train.py:105-114 there). An epoch is better only when its score is above the best
so far; an RL run's start counts as its first epoch, so RL must beat it. A score that is no
finite number (a NaN validation) is never better, and a start scored so is none to beat.

Counting the epochs since the kept one, a run may lower its lr (``train.lr_decay_patience``:
x ``lr_decay_rate`` each time that many have passed) and stop (``train.early_stop_patience``),
as that implementation does after 8 and 20 (train.py:84-88). The count follows from the epochs
done and the kept epoch, both in every checkpoint, so a resumed run counts on where it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def epochs_without_better(epochs_done: int, best_epoch: int) -> int:
    """Epochs validated since the kept one (``best_epoch`` 0-based; -1: the run's start)."""
    return epochs_done - 1 - best_epoch


def lr_decay_due(patience: int, without_better: int) -> bool:
    """Whether the lr falls now: after each ``patience`` epochs without a better one."""
    return patience > 0 and without_better > 0 and without_better % patience == 0


def out_of_patience(patience: int, without_better: int) -> bool:
    """Whether the run stops now: ``patience`` epochs have passed without a better one."""
    return patience > 0 and without_better >= patience


@dataclass
class Kept:
    """The epoch ``best.pt`` holds: its score on ``select_on``, its CIDEr (the log's and the
    report's) and its epoch (0-based; -1 before any epoch: none yet, or the run's start)."""

    select_on: str
    score: float = float("-inf")
    cider: float = float("-inf")
    epoch: int = -1

    def start(self, scores: dict[str, float]) -> None:
        """The run's start (another run's weights, validated) is the one to beat."""
        if math.isfinite(scores[self.select_on]):
            self.score, self.cider = scores[self.select_on], scores["cider"]

    def consider(self, scores: dict[str, float], epoch: int) -> bool:
        """Keep ``epoch`` (0-based) when its score beats the kept one's; whether it did."""
        score = scores[self.select_on]
        if not math.isfinite(score) or score <= self.score:
            return False
        self.score, self.cider, self.epoch = scores[self.select_on], scores["cider"], epoch
        return True

    def restore(self, checkpoint: dict) -> None:
        """What a checkpoint recorded of it; a NaN kept by a capstack that took it for better
        is none."""
        score = checkpoint["best_score"]
        if math.isfinite(score):
            self.score, self.cider, self.epoch = score, checkpoint["best_cider"], \
                checkpoint["best_epoch"]

    def recorded(self) -> dict:
        """What a checkpoint records of it."""
        return {"best_cider": self.cider, "best_epoch": self.epoch, "best_score": self.score}

    def epochs_without_better(self, epochs_done: int) -> int:
        return epochs_without_better(epochs_done, self.epoch)
