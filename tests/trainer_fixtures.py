"""Small real inputs for trainer tests: shapes captions prepared, and feature stores.

The stores hold random features made to be distinguishable per image, so
decoders can learn which caption belongs to which image.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from pipeline.captions.prepare import prepare_captions
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.stores import Record, Schema, create_writer, field

TINY_DECODER = {"embed": 32, "hidden": 32}
TINY_ATTENTION = {"embed": 32, "hidden": 32, "att_hidden": 16}


TINY_HACAP = {"embed": 32, "worker": 32, "manager": 16, "att_hidden": 16, "discriminator": 16,
              "discriminator_embed": 16}


TINY = {"hacap": TINY_HACAP, **{name: TINY_ATTENTION for name in (
    "soft_attention", "hard_attention", "top_down", "stack_cap", "stack_cap_star")},
    **{name: TINY_DECODER for name in ("show_tell", "lstm3", "gru_init")}}


def tiny_decoder_config(name: str) -> dict:
    """Small sizes for a decoder's tests: the papers' decoders' as chosen here; any other
    registered decoder's from its config (widths of 64 or more to 32, depths above 2 to 2), so
    a new decoder runs through every generic test without being listed."""
    if name in TINY:
        return dict(TINY[name])
    import dataclasses

    from trainer.decoders import DECODERS

    tiny = {}
    for f in dataclasses.fields(DECODERS.get(name).Config):
        if isinstance(f.default, int) and not isinstance(f.default, bool):
            if f.default >= 64:
                tiny[f.name] = 32
            elif "layers" in f.name and f.default > 2:
                tiny[f.name] = 2
    return tiny


def make_prepared(root: Path, n_train=12, n_val=4, n_test=4, seed=3) -> tuple[Path, Path]:
    """(dataset json, prepared folder) of a tiny shapes dataset."""
    data = root / "shapes"
    write_shapes_dataset(data, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, size=64)
    prepared = root / "prepared"
    prepare_captions(data / "dataset_shapes.json", prepared, min_count=1, max_len=16)
    return data / "dataset_shapes.json", prepared


def test_meta(kind: str, dim: int, fingerprint: str, grid: int | None = None) -> dict:
    """Metadata of a store made by these fixtures: grid cells, or regions with their boxes."""
    fields = [field("features", (dim,), "float16")]
    if kind == "regions":
        fields += [field("boxes", (4,), "float32"), field("scores", (), "float32"),
                   field("classes", (), "int32")]
    return {**Schema(tuple(fields), grid).to_meta(), "fingerprint": fingerprint,
            "producer": {"name": f"test-{kind}", "settings": {}, "about": {}},
            "capstack_version": "test"}


def write_feature_store(path: Path, image_ids, *, kind="grid", rows=4, dim=16, seed=0,
                        fingerprint="feedbeef", image_root: Path | None = None) -> Path:
    rng = np.random.default_rng(seed)
    meta = test_meta(kind, dim, fingerprint, grid=int(np.sqrt(rows)) if kind == "grid" else None)
    if image_root is not None:
        meta["image_root"] = str(image_root)
    with create_writer(path, meta) as writer:
        records = []
        for i in image_ids:
            n = rows if kind == "grid" else 2 + int(i) % 3
            feats = rng.standard_normal((n, dim)).astype(np.float32)
            boxes = None
            if kind == "regions":
                x = rng.uniform(0, 30, (n, 2)).astype(np.float32)
                boxes = np.concatenate([x, x + 20], 1)
            records.append((int(i),
                            Record(feats, 64, 64, boxes=boxes,
                                   scores=np.ones(n, np.float32) if boxes is not None else None,
                                   classes=np.zeros(n, np.int32) if boxes is not None else None)))
        writer.write(records)
        writer.finish()
    return path


def write_experiment(path: Path, *, decoder: str, captions: Path, features: list[Path],
                     epochs=2, batch_size=4, seq_per_img=2, objective: dict | None = None,
                     **train) -> Path:
    config = {"name": path.stem, "decoder": {"name": decoder, **tiny_decoder_config(decoder)},
              **({"objective": objective} if objective else {}),
              "data": {"captions": str(captions), "features": [str(f) for f in features],
                       "seq_per_img": seq_per_img},
              "train": {"epochs": epochs, "batch_size": batch_size, "lr": 5e-3, **train},
              "eval": {"beam_size": 2}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_object_store(path: Path, dataset_json: Path) -> Path:
    """Region features that describe each drawn object exactly: one-hot shape, one-hot colour
    and the box (x1, y1, x2, y2) / image side. A perception that cannot err, so what a decoder
    learns is captioning alone."""
    import json

    images = json.loads(Path(dataset_json).read_text())["images"]
    objects = [o for im in images for o in im["boxes"]]
    shapes = sorted({o["shape"] for o in objects})
    colors = sorted({o["color"] for o in objects})
    dim = len(shapes) + len(colors) + 4
    meta = test_meta("regions", dim, "0b1ec75")
    with create_writer(path, meta) as writer:
        records = []
        for im in images:
            side = 64.0
            boxes = np.array([o["box"] for o in im["boxes"]], np.float32)
            feats = np.zeros((len(boxes), dim), np.float32)
            for row, o in enumerate(im["boxes"]):
                feats[row, shapes.index(o["shape"])] = 1
                feats[row, len(shapes) + colors.index(o["color"])] = 1
            feats[:, -4:] = boxes / side
            records.append((int(im["imgid"]), Record(feats, 64, 64, boxes=boxes,
                                                     scores=np.ones(len(boxes), np.float32),
                                                     classes=np.zeros(len(boxes), np.int32))))
        writer.write(records)
        writer.finish()
    return path


def make_decoder(name: str, values: dict, vocab_size: int, feature_dim: int):
    """A decoder built as an experiment file builds it: its config parsed strictly first."""
    from trainer.config import component_from_dict
    from trainer.decoders import DECODERS, build_decoder

    spec = component_from_dict(DECODERS, {"name": name, **values}, "test", "decoder")
    return build_decoder(spec.name, spec.config, vocab_size, feature_dim)


def teacher_forced(model, feats, mask, captions, seq_per_img: int = 1):
    """The decoder's teacher-forced output over captions [B*S, T+1] of images feats [B, L, D]
    (``seq_per_img`` = S, the captions of an image adjacent)."""
    assert captions.shape[0] == feats.shape[0] * seq_per_img
    return model(model.encode(feats, mask), captions)


def mean_xe(logits, targets):
    """Cross-entropy per real target token of these captions."""
    from trainer.objectives.token_cross_entropy import token_cross_entropy

    return token_cross_entropy(logits, targets) / (targets != 0).sum()


def decoder_terms(model, out, targets, loc_mask):
    """The decoder's own loss terms per target token of these captions (one process)."""
    return model.loss_terms(out, targets, targets != 0, loc_mask).summed / (targets != 0).sum()


def cider_d(cache) -> list[str]:
    """The ``--set`` overrides that give an RL objective its CIDEr-D reward on ``cache``."""
    return ["objective.reward.name=cider-d", f"objective.reward.cache={cache}"]


def logged(run_dir: Path, key: str) -> list:
    """``key`` of every train line of a run's metrics.jsonl, in order."""
    import json

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x[key] for x in lines if x["kind"] == "train"]


def prepared_with_grid(root: Path) -> tuple[Path, Path]:
    """A prepared folder (10 train, 4 val, 2 test images) and a grid store covering it."""
    from pipeline.captions.prepared import load_captions

    _, prepared = make_prepared(root, n_train=10, n_val=4, n_test=2)
    return prepared, write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)


def grid_and_region_stores(root: Path) -> tuple[Path, Path, Path, Path]:
    """A prepared shapes dataset in ``root`` with an LMDB grid store and an HDF5 region store of
    its images: (root, prepared, grid, regions)."""
    from pipeline.captions.prepared import load_captions

    dataset, prepared = make_prepared(root)
    ids = load_captions(prepared).image_ids
    grid = write_feature_store(root / "grid.lmdb", ids, kind="grid", image_root=dataset.parent)
    regions = write_feature_store(root / "regions.h5", ids, kind="regions", seed=1,
                                  fingerprint="0ddba11", image_root=dataset.parent)
    return root, prepared, grid, regions


def train_losses(run_dir: Path) -> list[float]:
    """Every logged training step's loss of a run folder, in order."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["kind"] == "train"]
