"""A training run: its parts (build.py), where it stands (epoch, batch, step, the kept epoch),
and what happens between epochs: validation, the kept epoch (trainer/selection.py), the lr,
the checkpoints, the log (``metrics.jsonl``, and TensorBoard's events when asked)."""

from __future__ import annotations

import json
import os
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pipeline
from pipeline.core.errors import CapstackError, cannot_write
from pipeline.core.ranks import Ranks
from pipeline.core.regular import open_append
from trainer.checkpoint import save_checkpoint
from trainer.config import ExperimentConfig
from trainer.data import TrainBatches
from trainer.evaluation.validate import validate
from trainer.objectives import table_labels
from trainer.selection import Kept, lr_decay_due, out_of_patience
from trainer.training import loop, resume
from trainer.training.build import build, device_of


@dataclass
class EpochReport:
    """One finished epoch, for the caller to show: what ``capstack train`` prints."""

    epoch: int  # 1-based: the epoch just finished
    epochs: int  # planned
    loss: float | None  # mean training loss over the epoch's steps (None: none ran)
    val_cider: float  # greedy, on the validation images
    best_cider: float  # of the kept epoch
    best_epoch: int  # 1-based; 0: the checkpoint the run started from (train.init_from)
    seconds: float  # the epoch's training and validation here (a resumed epoch: its rest)
    select_on: str = "cider"  # the score the kept epoch is best on
    val_score: float | None = None  # that score: this epoch's,
    best_score: float | None = None  # and the kept epoch's


TENSORBOARD_MISSING = ("train.tensorboard: asked for, but tensorboard is not installed: "
                       "pip install 'capstack[tensorboard]' (or leave it off: metrics.jsonl "
                       "holds the same numbers)")


def require_tensorboard(config: ExperimentConfig) -> None:
    """Refuse, before any work, TensorBoard asked for and not installed."""
    if not config.train.tensorboard:
        return
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise CapstackError(TENSORBOARD_MISSING) from None


def tensorboard_writer(out_dir: Path):
    """TensorBoard events in ``out_dir/events``: a scalar ``<kind>/<key>`` per number of each
    metrics.jsonl entry (``train/loss``, ``val/cider``, ...), at its step."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(out_dir / "events"))


def resident_mb() -> float | None:
    """This process's resident memory now (Linux), for the log: RL must keep it flat."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Run:
    """One experiment's training: its parts, where it stands, where it is saved."""

    def __init__(self, config: ExperimentConfig, out_dir: Path, ranks: Ranks = Ranks()):
        self.config, self.out_dir, self.ranks = config, Path(out_dir), ranks
        self.device = device_of(config, ranks)
        self.made_batches: dict[str, TrainBatches] = {}  # split_batches's, made when asked
        parts = build(config, ranks, self.device, self.split_batches, self.log_event)
        self.captions, self.features, self.identity = parts.captions, parts.features, \
            parts.identity
        self.model, self.batches, self.objective = parts.model, parts.batches, parts.objective
        self.precision, self.optimizer, self.scheduler = parts.precision, parts.optimizer, \
            parts.scheduler
        self.loss, self.compiled = parts.loss, parts.compiled
        self.epoch, self.batch, self.step = 0, 0, 0
        self.epoch_loss = [0.0, 0]  # this epoch's summed training loss and its steps
        self.kept = Kept(config.train.select_on)
        self.events = tensorboard_writer(self.out_dir) if ranks.main and config.train.tensorboard \
            else None
        self.start = resume.starting_checkpoint(config)

    # ----------------------------------------------------------------- what it hands out

    def split_batches(self, split: str) -> TrainBatches:
        """A split's images in batches of this run's size, each image with ``seq_per_img`` of
        its captions (what an objective draws of its own: HACap's discriminator rounds)."""
        if split not in self.made_batches:
            t = self.config.train
            self.made_batches[split] = TrainBatches(
                self.captions, self.features, batch_size=t.batch_size,
                seq_per_img=self.config.data.seq_per_img, seed=t.seed, split=split,
                ranks=self.ranks)
        return self.made_batches[split]

    def log_event(self, entry: dict) -> None:
        """An objective's entry in the metrics log, at the step now running."""
        self.log({"kind": entry["kind"], "epoch": self.epoch, "step": self.step + 1,
                  **{k: v for k, v in entry.items() if k != "kind"}, "time": time.time()})

    # ----------------------------------------------------------------- starting

    def resume(self) -> tuple[int, int] | None:
        """Its own last.pt loaded (trainer/training/resume.py): (epoch, batch), or None."""
        return resume.resume(self)

    def start_from(self, path: str) -> None:
        resume.start_from(self, path)

    def check_ranks_agree(self) -> None:
        """Every rank must have resumed from the same checkpoint (a folder all nodes see)."""
        seen = self.ranks.gather((self.epoch, self.batch, self.step))
        if any(s != seen[0] for s in seen):
            rank = next(r for r, s in enumerate(seen) if s != seen[0])
            raise CapstackError(f"{self.out_dir}: rank {rank} found its run at (epoch, batch, "
                                f"step) {seen[rank]}, rank 0 at {seen[0]}: the run folder must be "
                                f"one folder that every node sees (a shared filesystem)")

    # ----------------------------------------------------------------- training

    def train_step(self, batch) -> dict:
        return loop.train_step(self, batch)

    def run_epoch(self, progress: bool) -> None:
        loop.run_epoch(self, progress)

    def validate(self) -> dict[str, float]:
        """CIDEr-D (the log's, the curves') and the score best.pt is kept on, greedy."""
        t = self.config.train
        return validate(self.model, self.captions, self.features, self.device,
                        max_len=t.max_len, limit=t.val_images, autocast=self.precision.autocast,
                        ranks=self.ranks, scores=tuple(dict.fromkeys(("cider", t.select_on))))

    def end_epoch(self, started: float) -> EpochReport:
        """Validate, keep the best, save; what the epoch gave (``started``: its perf_counter)."""
        t = self.config.train
        scores = self.validate()
        self.log({"kind": "val", "epoch": self.epoch, **scores, "rss_mb": resident_mb(),
                  "time": time.time()})
        self.scheduler.step()
        total, steps = self.epoch_loss
        self.epoch, self.batch, self.epoch_loss = self.epoch + 1, 0, [0.0, 0]
        if self.kept.consider(scores, self.epoch - 1):
            self.save("best.pt")
        if lr_decay_due(t.lr_decay_patience, self.kept.epochs_without_better(self.epoch)):
            for group in self.optimizer.param_groups:
                group["lr"] *= t.lr_decay_rate
        self.save("last.pt")
        return EpochReport(self.epoch, t.epochs, total / steps if steps else None,
                           scores["cider"], self.kept.cider, self.kept.epoch + 1,
                           time.perf_counter() - started, t.select_on, scores[t.select_on],
                           self.kept.score)

    def out_of_patience(self) -> bool:
        """Whether ``train.early_stop_patience`` epochs have passed without a better one."""
        return out_of_patience(self.config.train.early_stop_patience,
                               self.kept.epochs_without_better(self.epoch))

    # ----------------------------------------------------------------- what it writes

    def log(self, entry: dict) -> None:
        if not self.ranks.main:
            return
        append_line(self.out_dir / "metrics.jsonl", json.dumps(entry))
        if self.events is not None:
            step = entry.get("step", self.step)
            for key, value in entry.items():
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if key not in ("kind", "epoch", "step", "time") and number:
                    self.events.add_scalar(f"{entry['kind']}/{key}", value, step)
            self.events.flush()

    def payload(self) -> dict:
        return {
            "identity": self.identity, "experiment": self.config.to_dict(),
            "vocab": self.captions.vocab.to_json(), "stores": self.describe_stores(),
            "feature_dim": self.features.feature_dim,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "objective": self.objective.state_dict(), "precision": self.precision.state_dict(),
            "table": table_labels(self.objective),
            "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "batch": self.batch,
            "step": self.step, **self.kept.recorded(),
            "epoch_loss": list(self.epoch_loss), "start": self.start,
            "capstack_version": pipeline.__version__,
        }

    def describe_stores(self) -> list[dict]:
        return [{**d, "meta": s.meta} for d, s in zip(self.features.describe(),
                                                       self.features.stores)]

    def save(self, name: str) -> None:
        if self.ranks.main:
            save_checkpoint(self.out_dir / name, self.payload())

    def standing(self) -> dict:
        """Where the run stands, for its ``state.json``."""
        return {"epochs": self.config.train.epochs, "epochs_done": self.epoch,
                "steps": self.step, "best_cider": self.kept.cider, "best_epoch": self.kept.epoch}

    def close(self) -> None:
        """What the run holds beyond memory: the event log, the objective's scorer process."""
        self.objective.close()
        if self.events is not None:
            self.events.close()


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
