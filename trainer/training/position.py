"""Where a run stands: plain numbers, as nanoGPT's ``iter_num`` and ``best_val_loss``.

resume.py makes one (a fresh run's, or its ``last.pt``'s), the loop advances it a step and an
epoch at a time, and a checkpoint records it (:meth:`Position.recorded`): a new counter is a
field here, its step in :meth:`Position.stepped` or :meth:`Position.next_epoch`, and its entry
in :meth:`Position.recorded` and :meth:`Position.restored`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.training.selection import Kept


@dataclass
class Position:
    kept: Kept  # the epoch best.pt holds (trainer/training/selection.py)
    epoch: int = 0  # epochs done (0-based: the epoch running)
    batch: int = 0  # batches of that epoch done
    step: int = 0  # optimiser steps done
    # this epoch's summed training loss and its steps (a resumed epoch's mean is of them all)
    epoch_loss: list[float] = field(default_factory=lambda: [0.0, 0])

    @classmethod
    def fresh(cls, select_on: str) -> Position:
        return cls(Kept(select_on))

    def stepped(self, loss: float) -> None:
        """A step done on the epoch's next batch, of ``loss``."""
        self.epoch_loss = [self.epoch_loss[0] + loss, self.epoch_loss[1] + 1]
        self.batch += 1
        self.step += 1

    def next_epoch(self) -> float | None:
        """The epoch done; its mean training loss (None: it ran no step)."""
        total, steps = self.epoch_loss
        self.epoch, self.batch, self.epoch_loss = self.epoch + 1, 0, [0.0, 0]
        return total / steps if steps else None

    def recorded(self) -> dict:
        """What a checkpoint records of it (trainer/checkpoint.py's payload)."""
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step,
                **self.kept.recorded(), "epoch_loss": list(self.epoch_loss)}

    @classmethod
    def restored(cls, checkpoint: dict, select_on: str) -> Position:
        """A checkpoint's position (as trainer/checkpoint.py loads it: in today's form)."""
        kept = Kept(select_on)
        kept.restore(checkpoint)
        return cls(kept, checkpoint["epoch"], checkpoint["batch"], checkpoint["step"],
                   list(checkpoint["epoch_loss"]))

    def standing(self, epochs: int) -> dict:
        """Where the run stands, for its ``state.json`` (``epochs``: planned)."""
        return {"epochs": epochs, "epochs_done": self.epoch, "steps": self.step,
                "best_cider": self.kept.cider, "best_epoch": self.kept.epoch}
