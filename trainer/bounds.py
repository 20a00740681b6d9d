"""Where a config's numbers may lie: each field declares its :class:`Bound` with ``bounded``.

``trainer/config.py`` checks every declared bound when an experiment is read, so a
value outside it is named (``exp.yaml: train.lr: must be a finite number above 0,
got nan``) before torch or numpy meets it. The components' config dataclasses (the
objectives') declare theirs with the same helper.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass, field


MAX_EPOCHS = 10_000
MAX_STEPS = 1_000_000_000  # steps, batches or turns a setting counts
MAX_BATCH = 4096  # images of a batch
MAX_CAPTION_WORDS = 1000
MAX_IMAGES = 10_000_000
MAX_REGIONS = 10_000  # regions of an image
MAX_SAMPLES = 100  # captions per image: references, samples, beams, rollouts
MAX_FIGURES = 1000
MAX_READERS = 256  # reader processes of a run's batches
MAX_SEED = 2**32 - 1  # what every seeding (numpy's legacy seed included) accepts


@dataclass(frozen=True)
class Bound:
    """Where a config's number may lie. A whole number: from ``low`` to ``high``, both given
    and included. A float: finite, and ``low``/``high`` included or ``above``/``below``
    excluded, either end may be left open (None)."""

    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None

    def problem(self, value) -> str | None:
        """What is wrong with ``value`` (an int or a float), or None."""
        if isinstance(value, int):
            assert self.low is not None and self.high is not None, "an int's Bound names both ends"
            if self.low <= value <= self.high:
                return None
            return f"must be from {self.low} to {self.high}, got {value}"
        if math.isfinite(value) and all(
                end is None or holds(value, end) for end, holds in (
                    (self.low, operator.ge), (self.above, operator.gt),
                    (self.high, operator.le), (self.below, operator.lt))):
            return None
        return f"must be a finite number{self.describe()}, got {value}"

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f" from {self.low:g} to {self.high:g}"
        if self.high is None and self.below is None and self.low is not None:
            return f", {self.low:g} or more"
        ends = [f"at least {self.low:g}" if self.low is not None else
                f"above {self.above:g}" if self.above is not None else None,
                f"at most {self.high:g}" if self.high is not None else
                f"below {self.below:g}" if self.below is not None else None]
        return " " + " and ".join(end for end in ends if end) if any(ends) else ""


def bounded(default=dataclasses.MISSING, low=None, high=None, *, above=None, below=None,
            default_factory=dataclasses.MISSING):
    """A number field (or a list of numbers, each) of a config, with its :class:`Bound`:
    ``epochs: int = bounded(10, 1, MAX_EPOCHS)``, ``lr: float = bounded(4e-4, above=0)``."""
    return field(default=default, default_factory=default_factory,
                 metadata={"bound": Bound(low, high, above, below)})
