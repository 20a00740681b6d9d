"""Cross-entropy training on cached features, validated by greedy CIDEr after each epoch.

The loop holds no global state: everything it needs arrives as arguments, and
everything a resume needs (model, optimiser, scheduler, epoch, position in the
epoch, RNG) is in ``last.pt``. The epoch's batch order is a function of
(seed, epoch), so a resumed run's next losses equal the uninterrupted run's.
Outputs in ``out_dir``: ``last.pt``, ``best.pt`` (best validation CIDEr),
``metrics.jsonl`` (one JSON object per logged step or validation),
``config.json``, ``summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import pipeline
from pipeline.atomic import atomic_file, replace_path
from pipeline.errors import CapstackError
from pipeline.hashing import md5_of_file
from trainer.checkpoint import check_identity, identity, load_checkpoint, save_checkpoint
from trainer.config import ExperimentConfig
from trainer.data import Captions, Features, TrainBatches, check_coverage, load_captions
from trainer.decoders import build_decoder, decoder_config
from trainer.decoders.base import Decoder
from trainer.rewards.cider import CiderD
from trainer.c2f import CoarseToFine
from trainer.scst import SelfCritical
from trainer.validate import validate

log = logging.getLogger(__name__)
LOG_EVERY = 10  # steps between train lines in metrics.jsonl


RESUMABLE_CHANGES = {"epochs", "device", "checkpoint_every"}


@dataclass
class TrainResult:
    out_dir: Path
    best_cider: float
    best_epoch: int
    epochs: int
    steps: int
    resumed_at: tuple[int, int] | None  # (epoch, batch) of the checkpoint resumed from
    seconds: float


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CapstackError(f"train.device: {name!r} asked for, but no CUDA device is available")
    return device


def resident_mb() -> float | None:
    """This process's resident memory now (Linux), for the log: RL must keep it flat."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def tensorboard_writer(out_dir: Path):
    """TensorBoard events in ``out_dir/events`` when tensorboard is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional: metrics.jsonl has everything
        return None
    return SummaryWriter(str(out_dir / "events"))


def xe_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per real token (targets include <eos>; <pad> ignored)."""
    return F.cross_entropy(logits.transpose(1, 2).float(), targets, ignore_index=0)


def scheduled_sampling_prob(config, epoch: int) -> float:
    t = config.train
    if t.scheduled_sampling_start < 0 or epoch < t.scheduled_sampling_start:
        return 0.0
    rises = (epoch - t.scheduled_sampling_start) // max(t.scheduled_sampling_increase_every, 1)
    return min(t.scheduled_sampling_increase * rises, t.scheduled_sampling_max)


class Run:
    """One experiment's training: the data, model, optimiser and where they are saved."""

    def __init__(self, config: ExperimentConfig, out_dir: Path):
        self.config, self.out_dir = config, Path(out_dir)
        self.device = pick_device(config.train.device)
        self.captions: Captions = load_captions(config.data.captions)
        self.features = Features(config.data.features, config.data.max_regions,
                                 config.data.box_geometry)
        check_coverage(self.captions, self.features)
        self.decoder_values = asdict(decoder_config(config.decoder, config.decoder_config,
                                                    config.name))
        self.identity = identity(config.decoder, self.decoder_values, self.captions.vocab.itow,
                                 self.features.describe())
        torch.manual_seed(config.train.seed)  # the same initial weights for the same seed
        self.model: Decoder = build_decoder(config.decoder, config.decoder_config,
                                            len(self.captions.vocab),
                                            self.features.feature_dim).to(self.device)
        t = config.train
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=t.lr, betas=tuple(t.betas),
                                          weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.StepLR(
            self.optimizer, step_size=t.lr_decay_every or 10**9, gamma=t.lr_decay_rate)
        self.batches = TrainBatches(self.captions, self.features, batch_size=t.batch_size,
                                    seq_per_img=config.data.seq_per_img, seed=t.seed,
                                    bucket_by_length=config.data.bucket_by_length)
        self.epoch, self.batch, self.step = 0, 0, 0
        self.best_cider, self.best_epoch = float("-inf"), -1
        self.events = tensorboard_writer(self.out_dir)
        self.rl = self.reinforcement() if t.objective in ("scst", "c2f") else None
        self.start = self.starting_checkpoint()

    def reinforcement(self):
        """SCST or Stack-Cap's C2F, refused when the cached references are of other data."""
        t = self.config.train
        scorer = self.reward_cache()
        if t.objective == "c2f":
            if not hasattr(self.model, "heading"):
                raise CapstackError(f"train.objective c2f needs a coarse-to-fine decoder "
                                    f"(stack_cap, stack_cap_star), got {self.config.decoder}")
            return CoarseToFine(scorer, t.scst_samples, t.max_len, t.c2f_coarse_term)
        return SelfCritical(scorer, t.scst_samples, t.scst_baseline, t.max_len)

    def starting_checkpoint(self) -> dict | None:
        """``train.init_from`` and its digest: a run resumes only from the start it was given."""
        path = self.config.train.init_from
        if not path:
            return None
        file = Path(path) / "best.pt" if Path(path).is_dir() else Path(path)
        if not file.is_file():
            raise CapstackError(f"train.init_from: {path}: checkpoint not found (train it first)")
        return {"path": str(path), "md5": md5_of_file(file)}

    def reward_cache(self) -> CiderD:
        t = self.config.train
        scorer = CiderD.load(t.cider_cache)
        if scorer.vocab_digest() != self.identity["vocab"]["md5"]:
            raise CapstackError(f"{t.cider_cache}: built with another vocabulary than "
                                f"{self.captions.folder} (rebuild it: capstack cider-cache)")
        train_ids = self.captions.image_ids[self.captions.rows("train")]
        lacking = np.setdiff1d(train_ids, scorer.image_ids)
        if len(lacking):
            raise CapstackError(f"{t.cider_cache}: has no references for image {lacking[0]} of "
                                f"{self.captions.folder}'s train split (another dataset?)")
        return scorer

    def start_from(self, path: str) -> None:
        """Weights of another run's checkpoint (RL after XE), on the same data and decoder."""
        ckpt = load_checkpoint(path)
        check_identity(ckpt["identity"], self.identity, Path(ckpt["path"]))
        self.model.load_state_dict(ckpt["model"])
        # the starting point is the best so far: RL must beat it to replace best.pt
        self.best_cider = validate(self.model, self.captions, self.features, self.device,
                                   max_len=self.config.train.max_len,
                                   limit=self.config.train.val_images, autocast=self.autocast)
        self.log({"kind": "val", "epoch": -1, "cider": self.best_cider, "start": path,
                  "time": time.time()})
        self.save("best.pt")

    # ----------------------------------------------------------------- checkpoints

    def payload(self) -> dict:
        return {
            "identity": self.identity, "experiment": self.config.to_dict(),
            "vocab": self.captions.vocab.to_json(), "stores": self.describe_stores(),
            "feature_dim": self.features.feature_dim,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "batch": self.batch,
            "step": self.step, "best_cider": self.best_cider, "best_epoch": self.best_epoch,
            "start": self.start,
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
            "capstack_version": pipeline.__version__,
        }

    def describe_stores(self) -> list[dict]:
        return [{**d, "meta": s.meta} for d, s in zip(self.features.describe(),
                                                       self.features.stores)]

    def save(self, name: str) -> None:
        save_checkpoint(self.out_dir / name, self.payload())

    def resume(self) -> tuple[int, int] | None:
        path = self.out_dir / "last.pt"
        if not path.is_file():
            return None
        ckpt = load_checkpoint(path)
        check_identity(ckpt["identity"], self.identity, path)
        self.check_recipe(ckpt["experiment"], path)
        started = ckpt.get("start")
        if started != self.start:
            was = f"{started['path']} (md5 {started['md5']})" if started else "scratch"
            now = f"{self.start['path']} (md5 {self.start['md5']})" if self.start else "scratch"
            raise CapstackError(f"{path}: this run started from {was}, the config asks {now}")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.epoch, self.batch, self.step = ckpt["epoch"], ckpt["batch"], ckpt["step"]
        self.best_cider, self.best_epoch = ckpt["best_cider"], ckpt["best_epoch"]
        torch.set_rng_state(ckpt["rng"]["torch"])
        if ckpt["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        self.trim_log()
        return self.epoch, self.batch

    def check_recipe(self, saved: dict, path: Path) -> None:
        """A run resumes only with the training settings it was started with (more epochs,
        another device or checkpoint interval excepted): a changed lr is another run."""
        now = self.config.to_dict()
        for section in ("train", "data"):
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
        if not path.is_file():
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
        with open(self.out_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
        if self.events is not None:
            step = entry.get("step", self.step)
            for key, value in entry.items():
                if key not in ("kind", "epoch", "step", "time") and isinstance(value, (int, float)) \
                        and not isinstance(value, bool):
                    self.events.add_scalar(f"{entry['kind']}/{key}", value, step)
            self.events.flush()

    def autocast(self):
        if self.device.type == "cuda" and self.config.train.amp:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def train_step(self, batch, sample_prob: float) -> dict:
        batch = batch.to(self.device)
        with self.autocast():
            if self.rl is not None:
                loss, stats = self.rl.loss(self.model, batch.feats, batch.mask, batch.image_ids)
            else:
                loss, stats = self.xe_loss(batch, sample_prob)
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.train.grad_clip)
        self.optimizer.step()
        return {"loss": loss.item(), **stats, "time_backward": time.perf_counter() - started}

    def xe_loss(self, batch, sample_prob: float) -> tuple[torch.Tensor, dict]:
        captions = batch.captions[:, :int((batch.captions != 0).sum(1).max())]  # drop pad columns
        targets = captions[:, 1:]
        output = self.model(batch.feats, batch.mask, captions, self.config.data.seq_per_img,
                            sample_prob)
        xe = xe_loss(output.logits, targets)
        loc_mask = batch.mask.repeat_interleave(self.config.data.seq_per_img, 0)
        loss = xe + self.model.regularizer(output, targets, targets != 0, loc_mask)
        return loss, {"xe": xe.item()}

    def run_epoch(self, progress: bool) -> None:
        t = self.config.train
        sample_prob = scheduled_sampling_prob(self.config, self.epoch)
        bar = tqdm(total=len(self.batches), initial=self.batch, disable=not progress,
                   desc=f"{self.config.name} epoch {self.epoch + 1}/{t.epochs}", unit="batch")
        self.model.train()
        for batch in self.batches.epoch(self.epoch, self.batch):
            losses = self.train_step(batch, sample_prob)
            self.batch += 1
            self.step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses['loss']:.3f}", refresh=False)
            if self.step % LOG_EVERY == 0 or self.batch == len(self.batches):
                self.log({"kind": "train", "epoch": self.epoch, "step": self.step, **losses,
                          "lr": self.optimizer.param_groups[0]["lr"], "time": time.time()})
            if t.checkpoint_every and self.step % t.checkpoint_every == 0:
                self.save("last.pt")
        bar.close()

    def end_epoch(self) -> float:
        cider = validate(self.model, self.captions, self.features, self.device,
                         max_len=self.config.train.max_len, limit=self.config.train.val_images,
                         autocast=self.autocast)
        self.log({"kind": "val", "epoch": self.epoch, "cider": cider, "rss_mb": resident_mb(),
                  "time": time.time()})
        self.scheduler.step()
        self.epoch, self.batch = self.epoch + 1, 0
        if cider > self.best_cider:
            self.best_cider, self.best_epoch = cider, self.epoch - 1
            self.save("best.pt")
        self.save("last.pt")
        return cider


def train(config: ExperimentConfig, out_dir: str | Path, *, progress: bool = True,
          restart_on_change: bool = False) -> TrainResult:
    """Train (or resume) the experiment in ``out_dir`` until ``config.train.epochs``.

    A run folder whose checkpoint has other stores, vocabulary or decoder config
    is refused; with ``restart_on_change`` it is moved to ``<out_dir>.old``
    (replacing an earlier one) and training starts afresh: what a stage wants
    when its experiment file changed.
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = Run(config, out_dir)
    try:
        resumed_at = run.resume()
    except CapstackError as error:
        if not restart_on_change or not (out_dir / "last.pt").is_file():
            raise
        log.warning("%s; starting afresh, the old run moved to %s.old", error, out_dir)
        if run.events is not None:
            run.events.close()
        replace_path(out_dir, out_dir.with_name(out_dir.name + ".old"))
        out_dir.mkdir()
        run = Run(config, out_dir)
        resumed_at = None
    if resumed_at is None and config.train.init_from:
        run.start_from(config.train.init_from)
    with atomic_file(out_dir / "config.json") as tmp:
        tmp.write_text(json.dumps(config.to_dict(), indent=1) + "\n")
    while run.epoch < config.train.epochs:
        run.run_epoch(progress)
        cider = run.end_epoch()
        log.info("%s epoch %d: val CIDEr %.3f", config.name, run.epoch, cider)
    if not (out_dir / "best.pt").is_file():
        run.save("best.pt")
    result = TrainResult(out_dir, run.best_cider, run.best_epoch, run.epoch, run.step, resumed_at,
                         time.perf_counter() - started)
    with atomic_file(out_dir / "summary.json") as tmp:
        summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()}
        tmp.write_text(json.dumps(summary, indent=1) + "\n")
    return result
