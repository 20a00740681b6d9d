"""An epoch's steps: each a global batch's loss (the objective's, inside the module DDP
wraps), the decoder's optimiser step, then the objective's own ``after_step``; logged every
``train.log_every`` steps, checkpointed every ``train.checkpoint_every``.

A step's randomness (dropout, samples) is seeded from (seed, epoch, batch, rank), so a resumed
run's next losses equal the uninterrupted run's.
"""

from __future__ import annotations

import math
import time
from contextlib import closing
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from pipeline.core.errors import CapstackError
from trainer.objectives import StepKey
from trainer.read_ahead import read_ahead
from trainer.training import compiled

if TYPE_CHECKING:
    from trainer.training.run import Run


def train_step(run: Run, batch) -> dict:
    """One optimiser step on this rank's part of a global batch; the batch's statistics."""
    t = run.config.train
    torch.manual_seed(int(np.random.SeedSequence(
        [t.seed, run.epoch, batch.index, run.ranks.rank]).generate_state(1)[0]))
    key = StepKey(t.seed, run.epoch, batch.index)
    batch = batch.to(run.device)
    stats = optimizer_step(run.loss, batch, key, run.precision, run.optimizer, t.grad_clip,
                           run.compiled, run.ranks.world)
    stats = {**stats, **on_host(run.objective.after_step(run.model, batch, key))}
    return summed_over_ranks(run, stats)


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


def summed_over_ranks(run: Run, stats: dict) -> dict:
    """The global batch's statistics: each rank's parts added (its ``time_*`` kept)."""
    keys = [k for k in stats if not k.startswith("time_")]
    if not run.ranks.distributed:
        return stats
    total = run.ranks.sum(torch.tensor([stats[k] for k in keys], dtype=torch.float64,
                                       device=run.device))  # NCCL sums GPU tensors
    return {**stats, **dict(zip(keys, total.tolist()))}


def run_epoch(run: Run, progress: bool) -> None:
    """The rest of the epoch the run is in, from its next batch."""
    t = run.config.train
    bar = tqdm(total=len(run.batches), initial=run.batch,
               disable=not progress or not run.ranks.main,
               desc=f"{run.config.name} epoch {run.epoch + 1}/{t.epochs}", unit="batch")
    run.model.train()
    with closing(batches_of_epoch(run)) as batches:  # an error ends the readers at once
        for batch in batches:
            losses = run.train_step(batch)  # the step (Run.train_step: loop.train_step)
            stop_unless_finite(run, losses["loss"], batch)
            run.epoch_loss = [run.epoch_loss[0] + losses["loss"], run.epoch_loss[1] + 1]
            run.batch += 1
            run.step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses['loss']:.3f}", refresh=False)
            if run.step % t.log_every == 0 or run.batch == len(run.batches):
                run.log({"kind": "train", "epoch": run.epoch, "step": run.step, **losses,
                         "lr": run.optimizer.param_groups[0]["lr"], "time": time.time()})
            if t.checkpoint_every and run.step % t.checkpoint_every == 0:
                run.save("last.pt")
    bar.close()


def batches_of_epoch(run: Run):
    """The rest of the epoch's batches: made by ``data.readers`` processes (pinned on CUDA),
    or in this process, read ahead by a thread on CUDA (trainer/read_ahead.py)."""
    cuda = run.device.type == "cuda"
    if run.batches.readers:
        return run.batches.epoch(run.epoch, run.batch, pin_memory=cuda)
    return read_ahead(run.batches.epoch(run.epoch, run.batch), run.device)


def stop_unless_finite(run: Run, loss: float, batch) -> None:
    """Stop at a non-finite loss (the global batch's: every rank agrees), before anything
    is saved: the checkpoints on disk stay the last good ones."""
    if math.isfinite(loss):
        return
    ids = batch.image_ids if not run.ranks.distributed else f"{batch.image_ids} (rank " \
        f"{run.ranks.rank}'s part)"
    kept = [name for name in ("last.pt", "best.pt") if (run.out_dir / name).is_file()]
    raise CapstackError(
        f"{run.out_dir}: the loss is {loss} at step {run.step + 1} (epoch {run.epoch + 1}, "
        f"batch {run.batch + 1}) on images {ids}; training stopped, "
        + (f"{' and '.join(kept)} kept as they were" if kept else "no checkpoint written")
        + ": check those images' features (capstack verify --deep), or lower train.lr")
