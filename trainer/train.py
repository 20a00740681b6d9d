"""Training on cached features, validated by greedy CIDEr (or BLEU-4) each epoch: the loop.

What a step minimises is the experiment's objective (trainer/objectives/:
cross-entropy, SCST, coarse-to-fine, ...), a component the loop calls without
knowing which it is: the loss inside the module DDP wraps, the decoder's
optimiser step, then the objective's own ``after_step``.

The loop holds no global state: everything it needs arrives as arguments, and
everything a resume needs (model, optimiser, scheduler, epoch, position in the
epoch) is in ``last.pt``. The epoch's batch order is a function of (seed,
epoch), and a step's randomness (dropout, samples) of (seed, epoch, batch), so a
resumed run's next losses equal the uninterrupted run's.

Under ``torchrun`` the same loop runs in every process (pipeline/core/ranks.py):
DDP synchronises the gradients, each rank reads and scores its part of every
global batch and of the validation images, and only rank 0 writes. A
checkpoint does not depend on the number of processes that wrote it.
Outputs in ``out_dir``: ``last.pt``, ``best.pt`` (best validation CIDEr, or the score
``train.select_on`` names: trainer/selection.py),
``metrics.jsonl`` (one JSON object per logged step or validation),
``config.json``, ``summary.json``, ``state.json`` (running, finished, failed or
stopped: trainer/runs.py), and ``events/`` (TensorBoard) when ``train.tensorboard``
asks for it. After each epoch the caller's ``on_epoch`` gets an :class:`EpochReport`
(``capstack train`` prints it as one line).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

import pipeline
from pipeline.captions.prepared import Captions, load_captions
from pipeline.core.atomic import atomic_file, unused_sibling
from pipeline.core.errors import CapstackError, cannot_write
from pipeline.core.hashing import md5_of_file
from pipeline.core.jsonfile import write_json
from pipeline.core.ranks import Ranks, join
from pipeline.core.runlock import exclusive_beside
from trainer.checkpoint import check_identity, identity, load_checkpoint, save_checkpoint
from trainer.config import ExperimentConfig, experiment_from_dict
from trainer.data import Features, TrainBatches, covered
from trainer.decoders import build_decoder
from trainer.decoders.base import Decoder
from trainer.evaluation.validate import validate
from trainer.objectives import Setting, StepKey, TrainingLoss, build_objective, table_labels
from trainer.optimizers import build_optimizer
from trainer.precision import Precision
from trainer.read_ahead import read_ahead
from trainer.runs import RunRecord
from trainer.selection import epochs_without_better, lr_decay_due, out_of_patience

log = logging.getLogger(__name__)
# init_from: the start is compared by content (its md5, in resume), wherever the file now lies
RESUMABLE_CHANGES = {"epochs", "device", "amp", "checkpoint_every", "log_every", "init_from",
                     "tensorboard", "early_stop_patience"}
RECIPE = ("objective", "train", "data")  # what a resumed run shares with its start (and identity)


@dataclass
class TrainResult:
    out_dir: Path
    best_cider: float
    best_epoch: int
    epochs: int
    steps: int
    resumed_at: tuple[int, int] | None  # (epoch, batch) of the checkpoint resumed from
    seconds: float
    select_on: str = "cider"  # the validation score best.pt was kept on
    best_score: float | None = None  # that score of best.pt (best_cider: its CIDEr)
    stopped_early: bool = False  # train.early_stop_patience ended it before train.epochs


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


def resident_mb() -> float | None:
    """This process's resident memory now (Linux), for the log: RL must keep it flat."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


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


class Run:
    """One experiment's training: the data, model, optimiser and where they are saved."""

    def __init__(self, config: ExperimentConfig, out_dir: Path, ranks: Ranks = Ranks()):
        self.config, self.out_dir, self.ranks = config, Path(out_dir), ranks
        try:
            self.device = ranks.device(config.train.device)
        except CapstackError as error:
            raise CapstackError(f"train.device: {error}") from None
        t = config.train
        self.captions: Captions = load_captions(config.data.captions)
        self.features = Features(config.data.features, config.data.max_regions,
                                 config.data.box_geometry)
        self.captions = covered(self.captions, self.features)
        require_splits(self.captions, config.data.captions)
        self.identity = identity(config.decoder.name, asdict(config.decoder.config),
                                 self.captions.vocab.itow, self.features.describe())
        torch.manual_seed(t.seed)  # the same initial weights (the objective's too) per seed
        self.model: Decoder = build_decoder(config.decoder.name, config.decoder.config,
                                            len(self.captions.vocab),
                                            self.features.feature_dim).to(self.device)
        self.batches = TrainBatches(self.captions, self.features, batch_size=t.batch_size,
                                    seq_per_img=config.data.seq_per_img, seed=t.seed,
                                    batching=config.data.batching, ranks=ranks)
        self.made_batches: dict[str, TrainBatches] = {}  # split_batches's, made when asked
        self.objective = build_objective(config.objective.name, config.objective.config,
                                         Setting(self.captions, t.max_len, self.device,
                                                 epoch_batches=len(self.batches),
                                                 batches=self.split_batches, log=self.log_event))
        self.objective.to(self.device)
        self.objective.bind(self.model)
        self.precision = Precision(t.amp, self.device)
        self.precision.refuse_own_optimisers(self.objective.optimizers())
        self.optimizer = build_optimizer(
            t.optimizer.name, t.optimizer.config,
            [{"params": params, "name": name}
             for name, params in self.model.parameter_groups().items()], t.lr)
        self.scheduler = torch.optim.lr_scheduler.StepLR(
            self.optimizer, step_size=t.lr_decay_every or 10**9, gamma=t.lr_decay_rate)
        self.epoch, self.batch, self.step = 0, 0, 0
        self.best_cider, self.best_epoch = float("-inf"), -1
        self.best_score = float("-inf")  # of train.select_on; best_cider is the kept epoch's CIDEr
        self.epoch_loss = [0.0, 0]  # this epoch's summed training loss and its steps
        self.events = tensorboard_writer(self.out_dir) if ranks.main and t.tensorboard else None
        self.loss = self.wrap(TrainingLoss(self.model, self.objective))
        self.start = self.starting_checkpoint()

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

    def wrap(self, loss: TrainingLoss) -> torch.nn.Module:
        """DistributedDataParallel around the loss when there are several processes."""
        if not self.ranks.distributed:
            return loss
        from torch.nn.parallel import DistributedDataParallel

        trained = {id(p) for params in self.model.parameter_groups().values() for p in params}
        elsewhere = [f"decoder.{name}" for name, p in self.model.named_parameters()
                     if id(p) not in trained]  # an objective's own optimiser trains them
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(loss, elsewhere)
        return DistributedDataParallel(
            loss, find_unused_parameters=self.objective.leaves_parameters_out(self.model))

    def starting_checkpoint(self) -> dict | None:
        """``train.init_from`` and its digest: a run resumes only from the start it was given."""
        path = self.config.train.init_from
        if not path:
            return None
        file = Path(path) / "best.pt" if Path(path).is_dir() else Path(path)
        if not file.is_file():
            raise CapstackError(f"train.init_from: {path}: checkpoint not found (train it first)")
        return {"path": str(path), "md5": md5_of_file(file)}

    def start_from(self, path: str) -> None:
        """Weights of another run's checkpoint (RL after XE), on the same data and decoder."""
        ckpt = load_checkpoint(path)
        check_identity(ckpt["identity"], self.identity, Path(ckpt["path"]))
        self.model.load_state_dict(ckpt["model"])
        # the starting point is the best so far: RL must beat it to replace best.pt
        scores = self.validate()
        self.best_score, self.best_cider = scores[self.config.train.select_on], scores["cider"]
        self.log({"kind": "val", "epoch": -1, **scores, "start": path, "time": time.time()})
        self.save("best.pt")

    # ----------------------------------------------------------------- checkpoints

    def payload(self) -> dict:
        return {
            "identity": self.identity, "experiment": self.config.to_dict(),
            "vocab": self.captions.vocab.to_json(), "stores": self.describe_stores(),
            "feature_dim": self.features.feature_dim,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "objective": self.objective.state_dict(), "precision": self.precision.state_dict(),
            "table": table_labels(self.objective),
            "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "batch": self.batch,
            "step": self.step, "best_cider": self.best_cider, "best_epoch": self.best_epoch,
            "best_score": self.best_score,
            "epoch_loss": list(self.epoch_loss), "start": self.start,
            "capstack_version": pipeline.__version__,
        }

    def describe_stores(self) -> list[dict]:
        return [{**d, "meta": s.meta} for d, s in zip(self.features.describe(),
                                                       self.features.stores)]

    def save(self, name: str) -> None:
        if self.ranks.main:
            save_checkpoint(self.out_dir / name, self.payload())

    def resume(self) -> tuple[int, int] | None:
        path = self.out_dir / "last.pt"
        if not path.is_file():
            return None
        ckpt = load_checkpoint(path)
        check_identity(ckpt["identity"], self.identity, path)
        self.check_recipe(ckpt["experiment"], path)
        started = ckpt.get("start")
        if (started or {}).get("md5") != (self.start or {}).get("md5"):
            was = f"{started['path']} (md5 {started['md5']})" if started else "scratch"
            now = f"{self.start['path']} (md5 {self.start['md5']})" if self.start else "scratch"
            raise CapstackError(f"{path}: this run started from {was}, the config asks {now}")
        self.model.load_state_dict(ckpt["model"])
        check_optimiser_state(ckpt["optimizer"], self.optimizer, path)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.objective.load_state_dict(ckpt["objective"])
        self.precision.load_state_dict(ckpt.get("precision", {}))
        self.epoch, self.batch, self.step = ckpt["epoch"], ckpt["batch"], ckpt["step"]
        self.best_cider, self.best_epoch = ckpt["best_cider"], ckpt["best_epoch"]
        # saved before train.select_on: kept on CIDEr, its only score then
        self.best_score = ckpt.get("best_score", ckpt["best_cider"])
        # a checkpoint saved before runs kept it: the epoch's mean is of the steps run from here
        self.epoch_loss = list(ckpt.get("epoch_loss", [0.0, 0]))
        self.trim_log()
        return self.epoch, self.batch

    def check_ranks_agree(self) -> None:
        """Every rank must have resumed from the same checkpoint (a folder all nodes see)."""
        seen = self.ranks.gather((self.epoch, self.batch, self.step))
        if any(s != seen[0] for s in seen):
            rank = next(r for r, s in enumerate(seen) if s != seen[0])
            raise CapstackError(f"{self.out_dir}: rank {rank} found its run at (epoch, batch, "
                                f"step) {seen[rank]}, rank 0 at {seen[0]}: the run folder must be "
                                f"one folder that every node sees (a shared filesystem)")

    def check_recipe(self, saved: dict, path: Path) -> None:
        """A run resumes only with the training settings it was started with (more epochs,
        another device or checkpoint interval excepted): a changed lr is another run. The
        saved experiment is read as any experiment first, so a setting added since it was
        saved compares as its default."""
        saved = experiment_from_dict(saved, str(path)).to_dict()
        now = self.config.to_dict()
        for section in RECIPE:
            old, new = saved.get(section, {}), now[section]
            for key in sorted(set(old) | set(new)):
                if key in RESUMABLE_CHANGES or old.get(key) == new.get(key):
                    continue
                raise CapstackError(f"{path}: {section}.{key}: the run was trained with "
                                    f"{old.get(key)!r}, the config asks {new.get(key)!r} "
                                    f"(another run: use another --out, or --restart-on-change)")

    def trim_log(self) -> None:
        """Drop log lines written after the checkpoint (a killed run's lost work)."""
        path = self.out_dir / "metrics.jsonl"
        if not path.is_file() or not self.ranks.main:
            return
        kept = [line for line in path.read_text().splitlines() if line.strip() and
                self._before_checkpoint(json.loads(line))]
        with atomic_file(path) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))

    def _before_checkpoint(self, entry: dict) -> bool:
        if entry.get("kind") == "val":
            return entry["epoch"] < self.epoch
        return entry.get("step", 0) <= self.step

    # ----------------------------------------------------------------- the loop

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

    def train_step(self, batch) -> dict:
        """One optimiser step on this rank's part of a global batch; the batch's statistics."""
        t = self.config.train
        torch.manual_seed(int(np.random.SeedSequence(
            [t.seed, self.epoch, batch.index, self.ranks.rank]).generate_state(1)[0]))
        key = StepKey(t.seed, self.epoch, batch.index)
        started = time.perf_counter()
        batch = batch.to(self.device)
        with self.precision.autocast():
            loss, stats = self.loss(batch, key)
        backward_at = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.backward(loss * self.ranks.world)  # DDP averages the ranks' gradients
        self.precision.step(self.optimizer, t.grad_clip)
        stepped_at = time.perf_counter()
        stats = {"loss": loss.item(), **stats, **self.objective.after_step(self.model, batch, key)}
        stats.setdefault("time_forward", backward_at - started)
        stats["time_backward"] = stepped_at - backward_at
        return self.summed_over_ranks(stats)

    def summed_over_ranks(self, stats: dict) -> dict:
        """The global batch's statistics: each rank's parts added (its ``time_*`` kept)."""
        keys = [k for k in stats if not k.startswith("time_")]
        if not self.ranks.distributed:
            return stats
        total = self.ranks.sum(torch.tensor([stats[k] for k in keys], dtype=torch.float64,
                                            device=self.device))  # NCCL sums GPU tensors
        return {**stats, **dict(zip(keys, total.tolist()))}

    def run_epoch(self, progress: bool) -> None:
        t = self.config.train
        bar = tqdm(total=len(self.batches), initial=self.batch,
                   disable=not progress or not self.ranks.main,
                   desc=f"{self.config.name} epoch {self.epoch + 1}/{t.epochs}", unit="batch")
        self.model.train()
        for batch in read_ahead(self.batches.epoch(self.epoch, self.batch), self.device):
            losses = self.train_step(batch)
            self.stop_unless_finite(losses["loss"], batch)
            self.epoch_loss = [self.epoch_loss[0] + losses["loss"], self.epoch_loss[1] + 1]
            self.batch += 1
            self.step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses['loss']:.3f}", refresh=False)
            if self.step % t.log_every == 0 or self.batch == len(self.batches):
                self.log({"kind": "train", "epoch": self.epoch, "step": self.step, **losses,
                          "lr": self.optimizer.param_groups[0]["lr"], "time": time.time()})
            if t.checkpoint_every and self.step % t.checkpoint_every == 0:
                self.save("last.pt")
        bar.close()

    def stop_unless_finite(self, loss: float, batch) -> None:
        """Stop at a non-finite loss (the global batch's: every rank agrees), before anything
        is saved: the checkpoints on disk stay the last good ones."""
        if math.isfinite(loss):
            return
        ids = batch.image_ids if not self.ranks.distributed else f"{batch.image_ids} (rank " \
            f"{self.ranks.rank}'s part)"
        kept = [name for name in ("last.pt", "best.pt") if (self.out_dir / name).is_file()]
        raise CapstackError(
            f"{self.out_dir}: the loss is {loss} at step {self.step + 1} (epoch {self.epoch + 1}, "
            f"batch {self.batch + 1}) on images {ids}; training stopped, "
            + (f"{' and '.join(kept)} kept as they were" if kept else "no checkpoint written")
            + ": check those images' features (capstack verify --deep), or lower train.lr")

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
        if scores[t.select_on] > self.best_score:
            self.best_score, self.best_cider = scores[t.select_on], scores["cider"]
            self.best_epoch = self.epoch - 1
            self.save("best.pt")
        if lr_decay_due(t.lr_decay_patience, self.epochs_without_better()):
            for group in self.optimizer.param_groups:
                group["lr"] *= t.lr_decay_rate
        self.save("last.pt")
        return EpochReport(self.epoch, t.epochs, total / steps if steps else None,
                           scores["cider"], self.best_cider, self.best_epoch + 1,
                           time.perf_counter() - started, t.select_on, scores[t.select_on],
                           self.best_score)

    def epochs_without_better(self) -> int:
        return epochs_without_better(self.epoch, self.best_epoch)

    def out_of_patience(self) -> bool:
        """Whether ``train.early_stop_patience`` epochs have passed without a better one."""
        return out_of_patience(self.config.train.early_stop_patience,
                               self.epochs_without_better())

    def standing(self) -> dict:
        """Where the run stands, for its ``state.json``."""
        return {"epochs": self.config.train.epochs, "epochs_done": self.epoch,
                "steps": self.step, "best_cider": self.best_cider, "best_epoch": self.best_epoch}

    def close(self) -> None:
        """What the run holds beyond memory: the event log, the objective's scorer process."""
        self.objective.close()
        if self.events is not None:
            self.events.close()


def check_optimiser_state(saved: dict, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Refuse a saved optimiser state whose moments do not have their parameters' shapes (a run
    saved by a capstack whose decoder kept its weights in other blocks): torch would load it
    and fail at the first step with a size mismatch naming no file."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, state in saved.get("state", {}).items():
        shape = params[index].shape if 0 <= index < len(params) else None
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != shape:
                raise CapstackError(
                    f"{path}: its optimiser state does not fit this model (parameter {index}'s "
                    f"{key} is {list(value.shape)}, the parameter {list(shape or [])}): saved by "
                    f"a capstack whose decoder kept other weight shapes; start a new run from "
                    f"its weights instead (train.init_from: {path})")


def require_splits(captions: Captions, where) -> None:
    """Refuse, before the first step, captions with no train or no val image among those the
    stores hold: training validates on val every epoch, and an empty one was found only after
    a whole epoch."""
    for split in ("train", "val"):
        if len(captions.rows(split)) == 0:
            raise CapstackError(f"{where}: the {split} split has no images (among those every "
                                f"feature store holds); training needs train images and "
                                f"validates on val images every epoch")


def train(config: ExperimentConfig, out_dir: str | Path, *, progress: bool = True,
          restart_on_change: bool = False,
          on_epoch: Callable[[EpochReport], None] | None = None) -> TrainResult:
    """Train (or resume) the experiment in ``out_dir`` until ``config.train.epochs``.

    A run folder whose checkpoint has other stores, vocabulary or decoder config
    is refused; with ``restart_on_change`` it is moved to ``<out_dir>.old`` (or
    ``.old.2``, ``.old.3``... when taken: no run is ever deleted) and training
    starts afresh: what a stage wants when its experiment file changed. One
    training at a time writes a run folder (:func:`run_folder_held`). Under
    torchrun, every process calls this; the main one calls ``on_epoch`` after each
    epoch and records in ``state.json`` how the training ended.
    """
    require_tensorboard(config)
    device_type = "cuda" if Ranks().device(config.train.device).type == "cuda" else "cpu"
    out_dir = Path(out_dir)
    made_here = not out_dir.exists()
    with join(device_type) as ranks, run_folder_held(out_dir, ranks):
        record = RunRecord(out_dir, ranks.main)
        try:
            result = train_ranks(config, out_dir, ranks, progress, restart_on_change, record,
                                 on_epoch if ranks.main else None)
        except BaseException as error:
            if made_here and ranks.main:
                remove_unfinished_run(out_dir)
            if out_dir.is_dir():
                record.end(error)
            raise
        record.end()
        return result


def remove_unfinished_run(out_dir: Path) -> None:
    """A run folder this training made and failed before any checkpoint: its config and its
    log of a few steps are all it holds (the error said what went wrong), so it goes rather
    than look like a run. Anything else found in it keeps it."""
    if any(out_dir.glob("*.pt")):
        return
    for name in ("config.json", "metrics.jsonl", "state.json"):
        with suppress(OSError):
            (out_dir / name).unlink()
    with suppress(OSError):
        out_dir.rmdir()


def append_line(path: Path, line: str) -> None:
    """Append ``line`` to a log; when the disk refuses it, cut what was written of it (a
    resume reads every line) and say which file."""
    with open(path, "a") as f:
        start = f.tell()
        try:
            f.write(line + "\n")
            f.flush()
        except OSError as error:
            with suppress(OSError):
                f.truncate(start)
            raise cannot_write(path, error) from None


@contextmanager
def run_folder_held(out_dir: Path, ranks: Ranks):
    """The run folder is one training's at a time, through a sibling ``<out>.lock`` as a
    store's: a second training into it is refused at once, naming the holder (two would
    interleave their logs and checkpoints). Under torchrun the main rank holds it and every
    rank learns whether it did."""
    with ExitStack() as held:
        refusal = None
        if ranks.main:
            try:
                held.enter_context(exclusive_beside(out_dir, f"training into {out_dir}"))
            except CapstackError as error:
                refusal = str(error)
        refusal = ranks.broadcast(refusal)
        if refusal:
            raise CapstackError(refusal)
        yield


def record_experiment(out_dir: Path, experiment: dict) -> None:
    """The run's checkpoints carry the experiment as it reads now: a resumed run may differ in
    what does not change its training (eval settings, the name, more epochs), and evaluation
    reads its settings from the checkpoint."""
    for name in ("best.pt", "last.pt"):
        path = out_dir / name
        if path.is_file():
            ckpt = load_checkpoint(path)
            if ckpt["experiment"] != experiment:
                ckpt.pop("path")
                save_checkpoint(path, {**ckpt, "experiment": experiment})


def train_ranks(config: ExperimentConfig, out_dir: Path, ranks: Ranks, progress: bool,
                restart_on_change: bool, record: RunRecord,
                on_epoch: Callable[[EpochReport], None] | None) -> TrainResult:
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    run = Run(config, out_dir, ranks)
    try:
        resumed_at = run.resume()
    except CapstackError as error:
        run.close()
        if not restart_on_change or not (out_dir / "last.pt").is_file():
            raise
        ranks.barrier()  # every rank has read the old run before rank 0 moves it
        if ranks.main:
            kept = unused_sibling(out_dir, ".old")
            os.replace(out_dir, kept)
            log.warning("%s; starting afresh, the old run moved to %s", error, kept)
            out_dir.mkdir()
        ranks.barrier()
        run = Run(config, out_dir, ranks)
        resumed_at = None
    run.check_ranks_agree()
    try:
        return train_epochs(run, resumed_at, progress, record, on_epoch, started)
    finally:
        run.close()


def train_epochs(run: Run, resumed_at: tuple[int, int] | None, progress: bool,
                 record: RunRecord, on_epoch: Callable[[EpochReport], None] | None,
                 started: float) -> TrainResult:
    """The epochs still to train, each reported, and the run's summary."""
    config, out_dir, ranks = run.config, run.out_dir, run.ranks
    if resumed_at is None and config.train.init_from:
        run.start_from(config.train.init_from)
    if ranks.main:
        write_json(out_dir / "config.json", config.to_dict())
    record.begin(**run.standing())
    while run.epoch < config.train.epochs and not run.out_of_patience():
        epoch_started = time.perf_counter()
        run.run_epoch(progress)
        report = run.end_epoch(epoch_started)
        record.update(**run.standing())
        log.info("%s epoch %d: val CIDEr %.3f", config.name, run.epoch, report.val_cider)
        if on_epoch is not None:
            on_epoch(report)
    if not (out_dir / "best.pt").is_file():
        run.save("best.pt")
    if ranks.main:
        record_experiment(out_dir, config.to_dict())
    result = TrainResult(out_dir, run.best_cider, run.best_epoch, run.epoch, run.step, resumed_at,
                         time.perf_counter() - started, config.train.select_on, run.best_score,
                         run.epoch < config.train.epochs)
    if not ranks.main:
        return result
    write_json(out_dir / "summary.json",
               {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()})
    return result
