"""The evaluation stage: beam search on the test split, the papers' metrics, pictures.

``evaluate_checkpoint`` writes to ``out_dir``:
``results_<split>.json`` (COCO results format), ``metrics.json`` (approach,
metrics, the reason of every unavailable metric, tokenizer, checkpoint),
``attention/<image id>.png`` for the first few images and ``curves.png``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from pipeline.captions.vocab import Vocabulary
from trainer.checkpoint import check_identity, identity, load_checkpoint
from trainer.data import Features, batches_of, check_coverage, eval_batches, load_captions
from trainer.decoders import build_decoder, decoder_config
from trainer.decoders.base import Decoder
from trainer.evaluation.figures import attention_figure, stages_figure, training_curves
from trainer.evaluation.metrics import load_references, score
from trainer.evaluation.predict import Prediction, predict
from pipeline.core.ranks import pick_device

log = logging.getLogger(__name__)
EVAL_BATCH = 50


def load_model(ckpt: dict) -> tuple[Decoder, Vocabulary]:
    """The checkpoint's decoder (eval mode, CPU) and vocabulary, from the checkpoint alone."""
    vocab = Vocabulary.from_json(ckpt["vocab"], ckpt["path"])
    ident = ckpt["identity"]
    model = build_decoder(ident["decoder"], ident["decoder_config"], len(vocab), ckpt["feature_dim"])
    model.load_state_dict(ckpt["model"])
    return model.eval(), vocab


def evaluate_checkpoint(checkpoint: str | Path, out_dir: str | Path, *, split: str = "test",
                        beam_size: int = 5, max_len: int = 16, figures: int = 4,
                        device: str = "auto", spice: bool = True) -> dict:
    ckpt = load_checkpoint(checkpoint)
    experiment = ckpt["experiment"]
    captions = load_captions(experiment["data"]["captions"])
    features = Features(experiment["data"]["features"], experiment["data"]["max_regions"],
                        experiment["data"]["box_geometry"])
    check_coverage(captions, features)
    ident = ckpt["identity"]
    values = asdict(decoder_config(ident["decoder"], ident["decoder_config"], ckpt["path"]))
    check_identity(ident, identity(ident["decoder"], values, captions.vocab.itow,
                                   features.describe()), Path(ckpt["path"]))
    model, vocab = load_model(ckpt)
    dev = pick_device(device)
    preds = predict(model.to(dev), vocab, eval_batches(captions, features, split, EVAL_BATCH), dev,
                    beam_size=beam_size, max_len=max_len)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = [{"image_id": p.image_id, "caption": " ".join(p.words)} for p in preds]
    _write_json(out_dir / f"results_{split}.json", results)
    references = load_references(captions.references_path(split))
    scores = score({p.image_id: " ".join(p.words) for p in preds}, references, spice=spice)
    metrics = {"approach": experiment["name"], "objective": experiment["train"]["objective"],
               **scores, "split": split, "beam_size": beam_size,
               "checkpoint": ckpt["path"], "epoch": ckpt["best_epoch"] + 1}
    _write_json(out_dir / "metrics.json", metrics)
    _pictures(preds[:figures], features, captions, out_dir)
    if hasattr(model, "heading") and figures:
        _stage_pictures(model, vocab, [p.image_id for p in preds[:figures]], features, captions,
                        out_dir, dev, max_len)
    run_dir = Path(ckpt["path"]).parent
    if (run_dir / "metrics.jsonl").is_file():
        training_curves(run_dir / "metrics.jsonl", out_dir / "curves.png",
                        before=_starting_log(experiment["train"].get("init_from", "")))
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
        image = np.asarray(Image.open(path).convert("RGB"))
        attention_figure(image, p.words, p.alphas, out_dir / "attention" / f"{p.image_id}.png",
                         grid=grid, boxes=None if grid else p.boxes, title=" ".join(p.words))


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
        stages_figure(np.asarray(Image.open(path).convert("RGB")), rows,
                      out_dir / "stages" / f"{image_id}.png", grid=grid,
                      boxes=None if grid else per_stage[1][k].boxes)


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


def _write_json(path: Path, value) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(value, indent=1) + "\n")


def check_split(split: str) -> str:
    if split not in ("train", "val", "test"):
        raise CapstackError(f"--split: expected train, val or test, got {split!r}")
    return split
