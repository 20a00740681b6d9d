"""Building a run from its experiment: the data, the decoder, the objective, the optimiser, the
precision, the loss that DDP wraps when there are several processes, and the log. What it
builds (:class:`Parts`) is built once: where the run stands is trainer/training/position.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipeline.captions.prepared import Captions, load_captions
from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.core.ranks import Ranks
from pipeline.core.regular import require_regular
from trainer.checkpoint import identity
from trainer.config import ExperimentConfig
from trainer.data import Features, TrainBatches, covered
from trainer.decoders.base import Decoder
from trainer.objectives import Objective, Setting, TrainingLoss, build_objective
from trainer.optimizers import build_optimizer
from trainer.precision import Precision
from trainer.training.compiled import CompiledSteps, compiled_steps
from trainer.training.fits import check_fits
from trainer.training.log import MetricsLog


@dataclass
class Parts:
    """What a run trains with, where and how it writes; built once, never reassigned."""

    config: ExperimentConfig
    out_dir: Path  # the run folder: checkpoints, the log
    ranks: Ranks
    device: torch.device
    captions: Captions
    features: Features
    identity: dict  # what a checkpoint of it must match (trainer/checkpoint.py)
    model: Decoder
    batches: TrainBatches  # the train split's, epoch by epoch
    objective: Objective
    precision: Precision
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.StepLR
    loss: torch.nn.Module  # TrainingLoss, in DDP under torchrun
    compiled: CompiledSteps | None  # train.compile's, put in place for each step; None: off
    log: MetricsLog
    start: dict | None  # train.init_from and its digest: a run resumes only from its own start


def device_of(config: ExperimentConfig, ranks: Ranks) -> torch.device:
    try:
        return ranks.device(config.train.device)
    except CapstackError as error:
        raise CapstackError(f"train.device: {error}") from None


def data_of(config: ExperimentConfig) -> tuple[Captions, Features]:
    """The prepared captions of the images every store holds, and the stores."""
    features = Features(config.data.features, config.data.max_regions, config.data.box_geometry)
    captions = covered(load_captions(config.data.captions), features)
    require_splits(captions, config.data.captions)
    return captions, features


def build(config: ExperimentConfig, out_dir: Path, ranks: Ranks = Ranks()) -> Parts:
    """A run's parts, to train into ``out_dir`` (a folder that exists)."""
    t = config.train
    device = device_of(config, ranks)
    captions, features = data_of(config)
    check_fits(config, len(captions.vocab), features.feature_dim, device)
    torch.manual_seed(t.seed)  # the same initial weights (the objective's too) per seed
    model = config.build_decoder(len(captions.vocab), features.feature_dim).to(device)
    batches = TrainBatches(captions, features, batch_size=t.batch_size,
                           seq_per_img=config.data.seq_per_img, seed=t.seed,
                           batching=config.data.batching, ranks=ranks,
                           readers=config.data.readers)
    objective = build_objective(config.objective.name, config.objective.config,
                                Setting(captions, t.max_len, device,
                                        epoch_batches=len(batches),
                                        batches=split_batches(config, captions, features, ranks),
                                        log=lambda entry: log.objective_entry(entry)))
    objective.to(device)
    objective.bind(model)
    precision = Precision(t.amp, device)
    precision.refuse_own_optimisers(objective.optimizers())
    precision.refuse_unsupported(config.decoder.name, [model, objective])
    optimizer = build_optimizer(
        t.optimizer.name, t.optimizer.config,
        [{"params": params, "name": name} for name, params in model.parameter_groups().items()],
        t.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=t.lr_decay_every or 10**9, gamma=t.lr_decay_rate)
    log = MetricsLog(out_dir, ranks.main, t.tensorboard)
    start = starting_checkpoint(config)
    return Parts(config, Path(out_dir), ranks, device, captions, features,
                 identity(config.decoder.name, asdict(config.decoder.config),
                          captions.vocab.itow, features.describe()),
                 model, batches, objective, precision, optimizer, scheduler,
                 wrapped(TrainingLoss(model, objective), ranks),
                 compiled_steps(t.compile, t.compile_mode, model, device), log, start)


def close(parts: Parts) -> None:
    """What a run holds beyond memory: the objective's scorer process, the event log."""
    parts.objective.close()
    parts.log.close()


def split_batches(config: ExperimentConfig, captions: Captions, features: Features,
                  ranks: Ranks) -> Callable[[str], TrainBatches]:
    """A split's images in batches of the run's size, each image with ``seq_per_img`` of its
    captions, made when first asked (what an objective draws of its own: HACap's
    discriminator rounds)."""
    made: dict[str, TrainBatches] = {}

    def of(split: str) -> TrainBatches:
        if split not in made:
            t = config.train
            made[split] = TrainBatches(captions, features, batch_size=t.batch_size,
                                       seq_per_img=config.data.seq_per_img, seed=t.seed,
                                       split=split, ranks=ranks)
        return made[split]

    return of


def starting_checkpoint(config: ExperimentConfig) -> dict | None:
    """``train.init_from`` and its digest: a run resumes only from the start it was given."""
    path = config.train.init_from
    if not path:
        return None
    file = Path(path) / "best.pt" if Path(path).is_dir() else Path(path)
    try:  # a FIFO is named as one, never hashed (its read would wait for a writer)
        require_regular(file, "a checkpoint")
    except FileNotFoundError:
        raise CapstackError(f"train.init_from: {path}: checkpoint not found (train it "
                            f"first)") from None
    except OSError as error:
        raise CapstackError(f"train.init_from: {path}: cannot read it ({error.strerror})") \
            from None
    return {"path": str(path), "md5": md5_of_file(file)}


def wrapped(loss: TrainingLoss, ranks: Ranks) -> torch.nn.Module:
    """DistributedDataParallel around the loss when there are several processes."""
    if not ranks.distributed:
        return loss
    from torch.nn.parallel import DistributedDataParallel

    model, objective = loss.decoder, loss.objective
    trained = {id(p) for params in model.parameter_groups().values() for p in params}
    elsewhere = [f"decoder.{name}" for name, p in model.named_parameters()
                 if id(p) not in trained]  # an objective's own optimiser trains them
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(loss, elsewhere)
    return DistributedDataParallel(loss, find_unused_parameters=objective.leaves_parameters_out(
        model))


def require_splits(captions: Captions, where) -> None:
    """Refuse, before the first step, captions with no train or no val image among those the
    stores hold: training validates on val every epoch, and an empty one was found only after
    a whole epoch."""
    for split in ("train", "val"):
        if len(captions.rows(split)) == 0:
            raise CapstackError(f"{where}: the {split} split has no images (among those every "
                                f"feature store holds); training needs train images and "
                                f"validates on val images every epoch")
