"""The evaluation stage: beam search on the test split, the papers' metrics, pictures.

``evaluate_checkpoint`` writes to ``out_dir``:
``results_<split>.json`` (COCO results format), ``metrics.json`` (approach,
metrics, the reason of every unavailable metric, tokenizer, checkpoint),
``attention/<image id>.png`` for the first few images and ``curves.png``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict
from pathlib import Path

import torch

from pipeline.captions.prepared import load_captions
from pipeline.captions.vocab import EOS_ID, UNK_ID, Vocabulary
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.core.ranks import pick_device
from trainer.checkpoint import check_identity, identity, load_checkpoint
from trainer.config import EvalConfig, ExperimentConfig, experiment_from_dict, from_dict
from trainer.data import Features, batches_of, covered, eval_batches
from trainer.decoders import build_decoder
from trainer.decoders.base import Decoder, StagedDecoder
from trainer.decoders.hacap import HACap
from trainer.evaluation.figures import (attention_figure, goals_figure, stages_figure,
                                        training_curves)
from trainer.evaluation.metrics import load_references, score
from trainer.evaluation.predict import Prediction, predict
from trainer.objectives import OBJECTIVES

log = logging.getLogger(__name__)
EVAL_BATCH = 50


def load_model(ckpt: dict) -> tuple[Decoder, Vocabulary, ExperimentConfig]:
    """The checkpoint's decoder (eval mode, CPU), vocabulary and experiment, from it alone."""
    vocab = Vocabulary.from_json(ckpt["vocab"], ckpt["path"])
    config = experiment_from_dict(ckpt["experiment"], ckpt["path"])
    model = build_decoder(config.decoder.name, config.decoder.config, len(vocab),
                          ckpt["feature_dim"])
    model.load_state_dict(ckpt["model"])
    return model.eval(), vocab, config


def eval_settings(saved: EvalConfig, **given) -> EvalConfig:
    """The experiment's ``eval:`` settings, with those given on the command line (not None)."""
    chosen = {**asdict(saved), **{k: v for k, v in given.items() if v is not None}}
    return from_dict(EvalConfig, chosen, "capstack evaluate", "eval.")


def evaluate_checkpoint(checkpoint: str | Path, out_dir: str | Path, *, split: str | None = None,
                        beam_size: int | None = None, max_len: int | None = None,
                        figures: int | None = None, device: str = "auto",
                        spice: bool = True) -> dict:
    """Beam search on a split, scored; settings from the experiment's ``eval:`` unless given."""
    ckpt = load_checkpoint(checkpoint)
    model, vocab, config = load_model(ckpt)
    s = eval_settings(config.eval, split=split, beam_size=beam_size, max_len=max_len,
                      figures=figures)
    captions = load_captions(config.data.captions)
    features = Features(config.data.features, config.data.max_regions, config.data.box_geometry)
    captions = covered(captions, features)
    check_identity(ckpt["identity"], identity(config.decoder.name, asdict(config.decoder.config),
                                              captions.vocab.itow, features.describe()),
                   Path(ckpt["path"]))
    dev = pick_device(device)
    preds = predict(model.to(dev), vocab, eval_batches(captions, features, s.split, EVAL_BATCH),
                    dev, beam_size=s.beam_size, max_len=s.max_len)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / f"results_{s.split}.json",
               [{"image_id": p.image_id, "caption": " ".join(p.words)} for p in preds])
    references = load_references(captions.references_path(s.split))
    scores = score({p.image_id: " ".join(p.words) for p in preds}, references, spice=spice)
    objective = OBJECTIVES.get(config.objective.name)
    metrics = {"approach": config.name, "objective": config.objective.name,
               "training": objective.label, "family": objective.family,
               **scores, **dataclasses.asdict(s), "checkpoint": ckpt["path"],
               "epoch": ckpt["best_epoch"] + 1}
    write_json(out_dir / "metrics.json", metrics)
    _pictures(preds[:s.figures], features, captions, out_dir)
    if isinstance(model, StagedDecoder) and s.figures:
        _stage_pictures(model, vocab, [p.image_id for p in preds[:s.figures]], features, captions,
                        out_dir, dev, s.max_len)
    if isinstance(model, HACap) and s.figures:
        _goal_pictures(model, vocab, preds[:s.figures], features, out_dir, dev)
    run_dir = Path(ckpt["path"]).parent
    if (run_dir / "metrics.jsonl").is_file():
        training_curves(run_dir / "metrics.jsonl", out_dir / "curves.png",
                        before=_starting_log(config.train.init_from))
    return metrics


def _starting_log(init_from: str) -> Path | None:
    """The training log of the run an RL run started from (its XE phase), when still there."""
    if not init_from:
        return None
    start = Path(init_from)
    log_path = (start if start.is_dir() else start.parent) / "metrics.jsonl"
    return log_path if log_path.is_file() else None


def _pictures(preds: list[Prediction], features: Features, captions, out_dir: Path) -> None:
    """Attention figures of a few images, when the images can still be found."""
    grid = features.grid_size
    if not preds or preds[0].alphas is None or (grid is None and preds[0].boxes is None):
        return  # no attention, or grid and regions concatenated: no single picture of them
    files = _image_files(features, captions)
    for p in preds:
        path = files.get(p.image_id)
        if path is None or not path.is_file():
            log.warning("attention figure for image %s skipped: image file not found", p.image_id)
            continue
        try:
            attention_figure(path, p.words, p.alphas,
                             out_dir / "attention" / f"{p.image_id}.png", grid=grid,
                             boxes=None if grid else p.boxes, title=" ".join(p.words))
        except CapstackError as error:  # an image that no longer loads: no picture, said
            log.warning("attention figure for image %s skipped: %s", p.image_id, error)


def _stage_pictures(model, vocab, image_ids: list[int], features: Features, captions,
                    out_dir: Path, device, max_len: int) -> None:
    """Stack-Cap's Figure 3: every stage's greedy caption and attention, coarse to fine."""
    grid = features.grid_size
    batch = next(batches_of(features, image_ids, len(image_ids)))
    per_stage = []
    for stage in range(model.stages):
        with model.heading(stage):
            per_stage.append(predict(model, vocab, [batch], device, max_len=max_len))
    files = _image_files(features, captions)
    for k, image_id in enumerate(image_ids):
        path = files.get(image_id)
        if path is None or not path.is_file() or (grid is None and per_stage[1][k].boxes is None):
            continue
        rows = [("coarse" if i == 0 else f"fine {i}", p[k].words, None if i == 0 else p[k].alphas)
                for i, p in enumerate(per_stage)]
        try:
            stages_figure(path, rows, out_dir / "stages" / f"{image_id}.png", grid=grid,
                          boxes=None if grid else per_stage[1][k].boxes)
        except CapstackError as error:
            log.warning("stage figure for image %s skipped: %s", image_id, error)


def _goal_pictures(model: HACap, vocab, preds: list[Prediction], features: Features,
                   out_dir: Path, device) -> None:
    """HACap's Figures 3-4: the MANAGER's goals along each evaluated caption."""
    batch = next(batches_of(features, [p.image_id for p in preds], len(preds))).to(device)
    length = max(len(p.words) for p in preds) + 1
    tokens = torch.zeros(len(preds), length, dtype=torch.long, device=device)
    for k, p in enumerate(preds):
        ids = [vocab.wtoi.get(w, UNK_ID) for w in p.words] + [EOS_ID]
        tokens[k, :len(ids)] = torch.tensor(ids)
    trace = model.goal_trace(model.encode(batch.feats, batch.mask), tokens)
    for k, p in enumerate(preds):
        if p.words:
            goals_figure(p.words, trace["subgoals"][k].cpu().numpy(),
                         trace["cosines"][k].cpu().numpy(), trace["goals"][k].cpu().numpy(),
                         out_dir / "goals" / f"{p.image_id}.png", title=" ".join(p.words))


def _image_files(features: Features, captions) -> dict[int, Path]:
    """image id -> file, from the store's image root and the prepared image lists."""
    root = Path(features.stores[0].meta.get("image_root", ""))
    files = {}
    for split in ("train", "val", "test"):
        listing = captions.folder / f"images_{split}.json"
        if listing.is_file():
            for entry in json.loads(listing.read_text()):
                files[entry["image_id"]] = root / entry.get("filepath", "") / entry["filename"]
    return files
