"""A run's log: ``metrics.jsonl``, one JSON object a line (a logged step, a validation, an
objective's own entry), and TensorBoard's events beside it when ``train.tensorboard`` asks.
Only the main rank writes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pipeline.core.errors import CapstackError, cannot_write
from pipeline.core.regular import open_append

TENSORBOARD_MISSING = ("train.tensorboard: asked for, but tensorboard is not installed: "
                       "pip install 'capstack[tensorboard]' (or leave it off: metrics.jsonl "
                       "holds the same numbers)")


def require_tensorboard(asked: bool) -> None:
    """Refuse, before any work, TensorBoard asked for and not installed."""
    if not asked:
        return
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise CapstackError(TENSORBOARD_MISSING) from None


class MetricsLog:
    """``out_dir/metrics.jsonl`` (and ``out_dir/events`` with ``tensorboard``): a scalar
    ``<kind>/<key>`` per number of each entry (``train/loss``, ``val/cider``, ...), at its
    step. ``write`` on a rank other than the main one writes nothing."""

    def __init__(self, out_dir: Path, main: bool, tensorboard: bool):
        self.path, self.main = Path(out_dir) / "metrics.jsonl", main
        self.events = None
        if main and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.events = SummaryWriter(str(Path(out_dir) / "events"))
        self.step_now: tuple[int, int] | None = None  # (epoch, step) of the step running

    def write(self, entry: dict, step: int) -> None:
        """One entry; ``step``: TensorBoard's for an entry without its own (a validation)."""
        if not self.main:
            return
        append_line(self.path, json.dumps(entry))
        if self.events is not None:
            step = entry.get("step", step)
            for key, value in entry.items():
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if key not in ("kind", "epoch", "step", "time") and number:
                    self.events.add_scalar(f"{entry['kind']}/{key}", value, step)
            self.events.flush()

    @contextmanager
    def during_step(self, epoch: int, step: int) -> Iterator[None]:
        """Where an objective's entries (:meth:`objective_entry`) are written while a step
        runs: its epoch (0-based) and step (1-based: the step being made)."""
        self.step_now = (epoch, step)
        try:
            yield
        finally:
            self.step_now = None

    def objective_entry(self, entry: dict) -> None:
        """An objective's entry (``kind`` given), at the step now running (Setting.log)."""
        epoch, step = self.step_now or (0, 0)
        self.write({"kind": entry["kind"], "epoch": epoch, "step": step,
                    **{k: v for k, v in entry.items() if k != "kind"}, "time": time.time()},
                   step)

    def close(self) -> None:
        if self.events is not None:
            self.events.close()


def resident_mb() -> float | None:
    """This process's resident memory now (Linux), for the log: RL must keep it flat."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def append_line(path: Path, line: str) -> None:
    """Append ``line`` to a log; when the disk refuses it, cut what was written of it (a
    resume reads every line) and say which file."""
    with open_append(path, "a training log") as f:
        start = f.tell()
        try:
            f.write(line + "\n")
            f.flush()
        except OSError as error:
            with suppress(OSError):
                f.truncate(start)
            raise cannot_write(path, error) from None
