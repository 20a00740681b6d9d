"""Where a run starts: from scratch, from another run's weights (``train.init_from``: RL after
XE), or from its own ``last.pt``; and what a resume must agree with (the data and decoder of
its identity, its recipe, its start, its optimiser's shapes). A resume loads the parts
(build.py) and returns where the run stands (position.py)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from pipeline.core.atomic import atomic_file, unused_sibling
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json
from pipeline.core.regular import read_bytes
from trainer import upgrade
from trainer.checkpoint import check_identity, load_checkpoint
from trainer.config import ExperimentConfig, experiment_from_dict
from trainer.training.build import Parts
from trainer.training.position import Position

# init_from: the start is compared by content (its md5, in resume), wherever the file now lies
RESUMABLE_CHANGES = {"epochs", "device", "amp", "checkpoint_every", "log_every", "init_from",
                     "tensorboard", "early_stop_patience", "readers", "compile", "compile_mode"}
log = logging.getLogger(__name__)
RECIPE = ("objective", "train", "data")  # what a resumed run shares with its start (and identity)


def load_start(parts: Parts, path: str) -> None:
    """Weights of another run's checkpoint (RL after XE), on the same data and decoder, and
    with ``train.init_optimizer`` its optimiser's state."""
    ckpt = load_checkpoint(path)
    check_identity(ckpt["identity"], parts.identity, Path(ckpt["path"]),
                   training_only_may_differ=True)
    parts.model.load_state_dict(ckpt["model"])
    if parts.config.train.init_optimizer:
        start_optimiser(parts, ckpt, Path(ckpt["path"]))


def start_optimiser(parts: Parts, ckpt: dict, path: Path) -> None:
    """The start checkpoint's optimiser state (``train.init_optimizer``): its moments and step
    counts, with this run's lr and other settings; the same optimiser only."""
    saved = experiment_from_dict(ckpt["experiment"], str(path)).train.optimizer.name
    wanted = parts.config.train.optimizer.name
    if saved != wanted:
        raise CapstackError(f"train.init_optimizer: {path} was trained with optimizer {saved}, "
                            f"this run uses {wanted}: their states do not carry over")
    settings = [{k: v for k, v in group.items() if k != "params"}
                for group in parts.optimizer.param_groups]
    check_optimiser_state(ckpt["optimizer"], parts.optimizer, path)
    parts.optimizer.load_state_dict(ckpt["optimizer"])
    for group, own in zip(parts.optimizer.param_groups, settings):
        group.update(own)  # the moments are the start's; lr, betas, decay this run's


def resume(parts: Parts) -> Position | None:
    """The run's own ``last.pt`` loaded into its parts: where it stands; None when there is
    none. Another identity, recipe or start is refused."""
    path = parts.out_dir / "last.pt"
    if not path.is_file():
        check_left_behind(parts)
        return None
    ckpt = load_checkpoint(path)
    check_identity(ckpt["identity"], parts.identity, path)
    check_recipe(parts.config, ckpt["experiment"], path)
    check_start(ckpt["start"], parts.start, path)
    parts.model.load_state_dict(ckpt["model"])
    check_optimiser_state(ckpt["optimizer"], parts.optimizer, path)
    parts.optimizer.load_state_dict(ckpt["optimizer"])
    parts.scheduler.load_state_dict(ckpt["scheduler"])
    parts.objective.load_state_dict(ckpt["objective"])
    parts.precision.load_state_dict(ckpt["precision"])
    position = Position.restored(ckpt, parts.config.train.select_on)
    if parts.ranks.main:
        trim_log(parts.out_dir / "metrics.jsonl", position.epoch, position.step)
    return position


LEFT_BEHIND = ("last.pt", "best.pt", "config.json")  # what says a folder holds a run


def check_left_behind(parts: Parts) -> None:
    """A run folder without ``last.pt`` may still hold a run: its ``best.pt`` (the kept epoch,
    or the start an RL run validated), or the ``config.json`` of a training killed before its
    first checkpoint. Training afresh there replaces that best.pt and adds to that log, so it
    must be the same run: another identity, recipe or start is refused as a resume's is."""
    best, config = parts.out_dir / "best.pt", parts.out_dir / "config.json"
    if best.is_file():
        ckpt = load_checkpoint(best)
        check_identity(ckpt["identity"], parts.identity, best)
        check_recipe(parts.config, ckpt["experiment"], best)
        check_start(ckpt["start"], parts.start, best)
    elif config.is_file():
        check_recipe(parts.config, upgrade.saved_experiment(read_json(config, "run config"),
                                                            str(config)), config)


def check_start(started: dict | None, start: dict | None, path: Path) -> None:
    if (started or {}).get("md5") != (start or {}).get("md5"):
        was = f"{started['path']} (md5 {started['md5']})" if started else "scratch"
        now = f"{start['path']} (md5 {start['md5']})" if start else "scratch"
        raise CapstackError(f"{path}: this run started from {was}, the config asks {now}")


def check_recipe(config: ExperimentConfig, saved: dict, path: Path) -> None:
    """A run resumes only with the training settings it was started with (more epochs,
    another device or checkpoint interval excepted): a changed lr is another run. The
    saved experiment is read as any experiment first, so a setting added since it was
    saved compares as its default."""
    saved = experiment_from_dict(saved, str(path)).to_dict()
    now = config.to_dict()
    for section in RECIPE:
        old, new = saved.get(section, {}), now[section]
        for key in sorted(set(old) | set(new)):
            if key in RESUMABLE_CHANGES or old.get(key) == new.get(key):
                continue
            raise CapstackError(f"{path}: {section}.{key}: the run was trained with "
                                f"{old.get(key)!r}, the config asks {new.get(key)!r} "
                                f"(another run: use another --out, or --restart-on-change)")


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


def trim_log(path: Path, epoch: int, step: int) -> None:
    """Drop the log lines written after the checkpoint at (epoch, step): a killed run's lost
    work. A line that is no log entry (half written by a kill, edited by hand) is dropped too,
    said in a warning, and the log as it was is kept beside it (``metrics.jsonl.damaged``)."""
    try:
        data = read_bytes(path, "a training log")
    except FileNotFoundError:
        return
    kept, bad = [], []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        entry = _log_entry(line)
        if entry is None:
            bad.append(number)
        elif _before_checkpoint(entry, epoch, step):
            kept.append(line.decode("utf-8"))
    if bad:
        aside = unused_sibling(path, ".damaged")
        shutil.copyfile(path, aside)
        log.warning("%s: line%s %s %s no log entry; dropped (the log as it was is kept as %s)",
                    path, "s" if len(bad) > 1 else "", ", ".join(map(str, bad[:5])) +
                    (f" and {len(bad) - 5} more" if len(bad) > 5 else ""),
                    "are" if len(bad) > 1 else "is", aside)
    with atomic_file(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def _log_entry(line: bytes) -> dict | None:
    """A log line's entry (a JSON object with the fields the trim reads), or None."""
    try:
        entry = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(entry, dict):
        return None
    number = entry.get("epoch") if entry.get("kind") == "val" else entry.get("step", 0)
    return entry if isinstance(number, int) and not isinstance(number, bool) else None


def _before_checkpoint(entry: dict, epoch: int, step: int) -> bool:
    if entry.get("kind") == "val":
        return entry["epoch"] < epoch
    return entry.get("step", 0) <= step
