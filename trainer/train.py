"""``capstack train``: training on cached features, validated by greedy CIDEr (or the score
``train.select_on`` names) each epoch. The run itself is trainer/training/ (its parts, resume,
the step loop, between epochs); this module starts it, resumes or restarts it, and writes how
it ended.

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

import logging
import os
import time
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from pipeline.core.atomic import unused_sibling
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.core.ranks import Ranks, join
from pipeline.core.runlock import exclusive_beside
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.config import ExperimentConfig
from trainer.runs import RunRecord
from trainer.training import resume
from trainer.training.run import EpochReport, Run, require_tensorboard, resident_mb

__all__ = ["EpochReport", "Run", "TrainResult", "resident_mb", "train"]  # what callers import

log = logging.getLogger(__name__)


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
        if not restart_on_change or not any((out_dir / name).is_file()
                                            for name in resume.LEFT_BEHIND):
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
        log.info("%s epoch %d: val CIDEr %.1f", config.name, run.epoch, 100 * report.val_cider)
        if on_epoch is not None:
            on_epoch(report)
    if not (out_dir / "best.pt").is_file():
        run.save("best.pt")
    if ranks.main:
        record_experiment(out_dir, config.to_dict())
    result = TrainResult(out_dir, run.kept.cider, run.kept.epoch, run.epoch, run.step, resumed_at,
                         time.perf_counter() - started, config.train.select_on, run.kept.score,
                         run.epoch < config.train.epochs)
    if not ranks.main:
        return result
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()}
    summary["best_epoch"] = result.best_epoch + 1  # as state.json and the printed lines count
    write_json(out_dir / "summary.json", summary)
    return result
