"""The training loop, top to bottom: the epochs still to train, each a pass over its batches
and what happens after it (validation, the kept epoch, the lr, the checkpoints), and the step.

It reads the run's parts (build.py) and advances where the run stands (position.py); nothing
else changes either. A step is a global batch's loss (the objective's, inside the module DDP
wraps), the decoder's optimiser step, then the objective's own ``after_step``; logged every
``train.log_every`` steps, checkpointed every ``train.checkpoint_every``.

A step's randomness (dropout, samples) is seeded from (seed, epoch, batch, rank), so a resumed
run's next losses equal the uninterrupted run's.
"""

from __future__ import annotations

import math
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from pipeline.core.errors import CapstackError
from trainer.checkpoint import payload, save_checkpoint
from trainer.evaluation.validate import validate as greedy_scores
from trainer.objectives import StepKey, table_labels
from trainer.read_ahead import read_ahead
from trainer.training import compiled
from trainer.training.build import Parts
from trainer.training.log import resident_mb
from trainer.training.position import Position
from trainer.training.selection import lr_decay_due, out_of_patience


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


def train_epochs(parts: Parts, position: Position, progress: bool,
                 on_epoch: Callable[[EpochReport], None]) -> None:
    """From ``position`` to ``train.epochs``, or until ``train.early_stop_patience`` epochs
    have passed without a better one; ``on_epoch`` after each."""
    while position.epoch < parts.config.train.epochs and not patience_spent(parts, position):
        started = time.perf_counter()
        run_epoch(parts, position, progress)
        on_epoch(end_epoch(parts, position, started))


def patience_spent(parts: Parts, position: Position) -> bool:
    """Whether ``train.early_stop_patience`` epochs have passed without a better one."""
    return out_of_patience(parts.config.train.early_stop_patience,
                           position.kept.epochs_without_better(position.epoch))


# ----------------------------------------------------------------------------- an epoch

def run_epoch(parts: Parts, position: Position, progress: bool) -> None:
    """The rest of the epoch the run is in, from its next batch."""
    t = parts.config.train
    bar = tqdm(total=len(parts.batches), initial=position.batch,
               disable=not progress or not parts.ranks.main,
               desc=f"{parts.config.name} epoch {position.epoch + 1}/{t.epochs}", unit="batch")
    parts.model.train()
    with closing(batches_of_epoch(parts, position)) as batches:  # an error ends the readers
        for batch in batches:
            losses = train_step(parts, position, batch)
            stop_unless_finite(parts, position, losses["loss"], batch)
            position.stepped(losses["loss"])
            bar.update(1)
            bar.set_postfix(loss=f"{losses['loss']:.3f}", refresh=False)
            if position.step % t.log_every == 0 or position.batch == len(parts.batches):
                parts.log.write({"kind": "train", "epoch": position.epoch, "step": position.step,
                                 **losses, "lr": parts.optimizer.param_groups[0]["lr"],
                                 "time": time.time()}, position.step)
            if t.checkpoint_every and position.step % t.checkpoint_every == 0:
                save(parts, position, "last.pt")
    bar.close()


def end_epoch(parts: Parts, position: Position, started: float) -> EpochReport:
    """Validate, keep the best, save; what the epoch gave (``started``: its perf_counter)."""
    t = parts.config.train
    scores = validate(parts)
    parts.log.write({"kind": "val", "epoch": position.epoch, **scores, "rss_mb": resident_mb(),
                     "time": time.time()}, position.step)
    parts.scheduler.step()
    loss = position.next_epoch()
    kept = position.kept
    if kept.consider(scores, position.epoch - 1):
        save(parts, position, "best.pt")
    if lr_decay_due(t.lr_decay_patience, kept.epochs_without_better(position.epoch)):
        for group in parts.optimizer.param_groups:
            group["lr"] *= t.lr_decay_rate
    save(parts, position, "last.pt")
    return EpochReport(position.epoch, t.epochs, loss, scores["cider"], kept.cider,
                       kept.epoch + 1, time.perf_counter() - started, t.select_on,
                       scores[t.select_on], kept.score)


def score_start(parts: Parts, position: Position, path: str) -> None:
    """The start another run's weights gave (resume.load_start), validated: the best so far,
    which the run must beat to replace best.pt."""
    scores = validate(parts)
    position.kept.start(scores)
    parts.log.write({"kind": "val", "epoch": -1, **scores, "start": path, "time": time.time()},
                    position.step)
    save(parts, position, "best.pt")


def validate(parts: Parts) -> dict[str, float]:
    """CIDEr-D (the log's, the curves') and the score best.pt is kept on, greedy."""
    t = parts.config.train
    return greedy_scores(parts.model, parts.captions, parts.features, parts.device,
                         max_len=t.max_len, limit=t.val_images,
                         autocast=parts.precision.autocast, ranks=parts.ranks,
                         scores=tuple(dict.fromkeys(("cider", t.select_on))))


def save(parts: Parts, position: Position, name: str) -> None:
    """The run as it stands, as ``out_dir/name`` (the main rank's)."""
    if not parts.ranks.main:
        return
    save_checkpoint(parts.out_dir / name, payload(
        parts.identity, parts.config.to_dict(), parts.captions.vocab, parts.features,
        parts.model.state_dict(), table_labels(parts.objective), position.recorded(),
        optimizer=parts.optimizer.state_dict(), objective=parts.objective.state_dict(),
        precision=parts.precision.state_dict(), scheduler=parts.scheduler.state_dict(),
        start=parts.start))


def batches_of_epoch(parts: Parts, position: Position):
    """The rest of the epoch's batches: made by ``data.readers`` processes (pinned on CUDA),
    or in this process, read ahead by a thread on CUDA (trainer/read_ahead.py)."""
    cuda = parts.device.type == "cuda"
    if parts.batches.readers:
        return parts.batches.epoch(position.epoch, position.batch, pin_memory=cuda)
    return read_ahead(parts.batches.epoch(position.epoch, position.batch), parts.device)


def stop_unless_finite(parts: Parts, position: Position, loss: float, batch) -> None:
    """Stop at a non-finite loss (the global batch's: every rank agrees), before anything
    is saved: the checkpoints on disk stay the last good ones."""
    if math.isfinite(loss):
        return
    ranks, out_dir = parts.ranks, parts.out_dir
    ids = batch.image_ids if not ranks.distributed else f"{batch.image_ids} (rank " \
        f"{ranks.rank}'s part)"
    kept = [name for name in ("last.pt", "best.pt") if (out_dir / name).is_file()]
    raise CapstackError(
        f"{out_dir}: the loss is {loss} at step {position.step + 1} (epoch "
        f"{position.epoch + 1}, batch {position.batch + 1}) on images {ids}; training stopped, "
        + (f"{' and '.join(kept)} kept as they were" if kept else "no checkpoint written")
        + ": check those images' features (capstack verify --deep), or lower train.lr")


# ----------------------------------------------------------------------------- a step

def train_step(parts: Parts, position: Position, batch) -> dict:
    """One optimiser step on this rank's part of a global batch, the next after ``position``
    (which it leaves as it is); the batch's statistics."""
    t = parts.config.train
    torch.manual_seed(int(np.random.SeedSequence(
        [t.seed, position.epoch, batch.index, parts.ranks.rank]).generate_state(1)[0]))
    key = StepKey(t.seed, position.epoch, batch.index)
    batch = batch.to(parts.device)
    with parts.log.during_step(position.epoch, position.step + 1):  # an objective's entries
        stats = optimizer_step(parts.loss, batch, key, parts.precision, parts.optimizer,
                               t.grad_clip, parts.compiled, parts.ranks.world)
        stats = {**stats, **on_host(parts.objective.after_step(parts.model, batch, key))}
    return summed_over_ranks(parts, stats)


def optimizer_step(loss_of, batch, key: StepKey, precision, optimizer, grad_clip: float,
                   compiled_steps: compiled.CompiledSteps | None = None, world: int = 1) -> dict:
    """``loss_of(batch, key)``'s loss, its gradients and the optimiser's update: the step the
    training loop and the benchmarks time alike. Its statistics come to the host once, at its
    end (:func:`on_host`): the only wait for the device the step's own code asks for."""
    started = time.perf_counter()
    with precision.autocast(), compiled.active(compiled_steps):
        loss, stats = loss_of(batch, key)
    backward_at = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    precision.backward(loss * world)  # DDP averages the ranks' gradients
    precision.step(optimizer, grad_clip)
    stepped_at = time.perf_counter()
    stats = on_host({"loss": loss, **stats})
    stats.setdefault("time_forward", backward_at - started)
    stats["time_backward"] = stepped_at - backward_at
    return stats


def on_host(stats: dict) -> dict:
    """The statistics as numbers, their tensors (the loss, an objective's own) brought to the
    host in one copy: each ``.item()`` would wait for the device on its own."""
    tensors = {k: v for k, v in stats.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        return stats
    values = torch.stack([v.detach().reshape(()).to(torch.float64) for v in tensors.values()])
    return {**stats, **dict(zip(tensors, values.tolist()))}


def summed_over_ranks(parts: Parts, stats: dict) -> dict:
    """The global batch's statistics: each rank's parts added (its ``time_*`` kept)."""
    keys = [k for k in stats if not k.startswith("time_")]
    if not parts.ranks.distributed:
        return stats
    total = parts.ranks.sum(torch.tensor([stats[k] for k in keys], dtype=torch.float64,
                                         device=parts.device))  # NCCL sums GPU tensors
    return {**stats, **dict(zip(keys, total.tolist()))}
