"""Which epoch a run keeps as ``best.pt``, and what epochs without a better one do.

``train.select_on`` names the greedy validation score the kept epoch is best on: CIDEr-D (the
default, as before the setting) or BLEU-4, on which poojahira's bottom-up/top-down keeps its
checkpoint (train.py:105-114 there). An epoch is better only when its score is above the best
so far; an RL run's start counts as its first epoch, so RL must beat it.

Counting the epochs since the kept one, a run may lower its lr (``train.lr_decay_patience``:
x ``lr_decay_rate`` each time that many have passed) and stop (``train.early_stop_patience``),
as that implementation does after 8 and 20 (train.py:84-88). The count follows from the epochs
done and the kept epoch, both in every checkpoint, so a resumed run counts on where it was.
"""

from __future__ import annotations


def epochs_without_better(epochs_done: int, best_epoch: int) -> int:
    """Epochs validated since the kept one (``best_epoch`` 0-based; -1: the run's start)."""
    return epochs_done - 1 - best_epoch


def lr_decay_due(patience: int, without_better: int) -> bool:
    """Whether the lr falls now: after each ``patience`` epochs without a better one."""
    return patience > 0 and without_better > 0 and without_better % patience == 0


def out_of_patience(patience: int, without_better: int) -> bool:
    """Whether the run stops now: ``patience`` epochs have passed without a better one."""
    return patience > 0 and without_better >= patience
