"""``capstack train``'s entry: the run folder (one training at a time, removed when a training
that made it failed before any checkpoint), the parts built, a resume or a restart, a start
from another run's weights, the epochs (loop.py), and how the training ended (``state.json``:
trainer/runs.py; ``summary.json``; the experiment carried by the checkpoints).

Under ``torchrun`` the same function runs in every process (pipeline/core/ranks.py): DDP
synchronises the gradients, each rank reads and scores its part of every global batch and of
the validation images, and only rank 0 writes. A checkpoint does not depend on the number of
processes that wrote it.
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
from trainer.training import loop, resume
from trainer.training.build import Parts, build, close
from trainer.training.log import require_tensorboard
from trainer.training.loop import EpochReport
from trainer.training.position import Position

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
    require_tensorboard(config.train.tensorboard)
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


def train_ranks(config: ExperimentConfig, out_dir: Path, ranks: Ranks, progress: bool,
                restart_on_change: bool, record: RunRecord,
                on_epoch: Callable[[EpochReport], None] | None) -> TrainResult:
    """This process's part of the training: the run built and resumed (or restarted), its
    epochs, its summary."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    parts, position = resumed(config, out_dir, ranks, restart_on_change)
    try:
        resumed_at = None if position is None else (position.epoch, position.batch)
        if position is None:
            position = Position.fresh(config.train.select_on)
            if config.train.init_from:
                resume.load_start(parts, config.train.init_from)
                loop.score_start(parts, position, config.train.init_from)
        if ranks.main:
            write_json(out_dir / "config.json", config.to_dict())
        record.begin(**position.standing(config.train.epochs))
        loop.train_epochs(parts, position, progress,
                          lambda report: epoch_done(parts, position, record, report, on_epoch))
        return finish(parts, position, resumed_at, started)
    finally:
        close(parts)


def resumed(config: ExperimentConfig, out_dir: Path, ranks: Ranks,
            restart_on_change: bool) -> tuple[Parts, Position | None]:
    """The run built, and where its own ``last.pt`` left it (None: a new run). A run folder
    that holds another run is refused, or with ``restart_on_change`` moved aside
    (``<out_dir>.old``) for a new run."""
    parts = build(config, out_dir, ranks)
    try:
        position = resume.resume(parts)
    except CapstackError as error:
        close(parts)
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
        parts, position = build(config, out_dir, ranks), None
    try:
        check_ranks_agree(parts, position or Position.fresh(config.train.select_on))
    except BaseException:
        close(parts)
        raise
    return parts, position


def check_ranks_agree(parts: Parts, position: Position) -> None:
    """Every rank must have resumed from the same checkpoint (a folder all nodes see)."""
    seen = parts.ranks.gather((position.epoch, position.batch, position.step))
    if any(s != seen[0] for s in seen):
        rank = next(r for r, s in enumerate(seen) if s != seen[0])
        raise CapstackError(f"{parts.out_dir}: rank {rank} found its run at (epoch, batch, "
                            f"step) {seen[rank]}, rank 0 at {seen[0]}: the run folder must be "
                            f"one folder that every node sees (a shared filesystem)")


def epoch_done(parts: Parts, position: Position, record: RunRecord, report: EpochReport,
               on_epoch: Callable[[EpochReport], None] | None) -> None:
    """An epoch's end, told: ``state.json``, the log, the caller."""
    config = parts.config
    record.update(**position.standing(config.train.epochs))
    log.info("%s epoch %d: val CIDEr %.1f", config.name, position.epoch, 100 * report.val_cider)
    if on_epoch is not None:
        on_epoch(report)


def finish(parts: Parts, position: Position, resumed_at: tuple[int, int] | None,
           started: float) -> TrainResult:
    """best.pt (the last epoch's, when none was better than the start: a run always has one),
    the experiment as it reads now in the checkpoints, and the run's ``summary.json``."""
    config, out_dir, ranks = parts.config, parts.out_dir, parts.ranks
    if not (out_dir / "best.pt").is_file():
        loop.save(parts, position, "best.pt")
    if ranks.main:
        record_experiment(out_dir, config.to_dict())
    kept = position.kept
    result = TrainResult(out_dir, kept.cider, kept.epoch, position.epoch, position.step,
                         resumed_at, time.perf_counter() - started, config.train.select_on,
                         kept.score, position.epoch < config.train.epochs)
    if not ranks.main:
        return result
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()}
    summary["best_epoch"] = result.best_epoch + 1  # as state.json and the printed lines count
    write_json(out_dir / "summary.json", summary)
    return result


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
