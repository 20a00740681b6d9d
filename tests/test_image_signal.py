"""benchmarks/image_signal.py: a decoder given one feature for every image reads nothing of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.captions.prepared import load_captions
from pipeline.features.stores import Record, create_writer
from trainer.config import load_experiment
from trainer.train import train
from scripts import load_script
from trainer_fixtures import make_prepared, write_experiment, write_feature_store
from trainer_fixtures import test_meta as store_meta



def image_signal():
    return load_script("benchmarks/image_signal.py").image_signal


def write_one_feature_for_all(path: Path, image_ids, dim=16) -> Path:
    feats = np.random.default_rng(0).standard_normal((4, dim)).astype(np.float32)
    with create_writer(path, store_meta("grid", dim, "0ne0ne", grid=2)) as writer:
        writer.write([(int(i), Record(feats, 64, 64)) for i in image_ids])
        writer.finish()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("signal")
    _, prepared = make_prepared(root)
    ids = load_captions(prepared).image_ids
    made = {}
    for name, store in [("blind", write_one_feature_for_all(root / "same.lmdb", ids)),
                        ("seeing", write_feature_store(root / "grid.lmdb", ids))]:
        exp = write_experiment(root / f"{name}.yaml", decoder="show_tell", captions=prepared,
                               features=[store], epochs=1)
        made[name] = train(load_experiment(exp), root / name, progress=False).out_dir
    return made


def test_a_decoder_given_one_feature_for_every_image_gets_nothing_from_it(runs):
    r = image_signal()(str(Path(runs["blind"]) / "best.pt"), "val")
    assert r["own"] == r["other"]
    assert r["distinct"] == 1 and r["images"] == 4


def test_another_images_features_change_the_captions_likelihood(runs):
    r = image_signal()(str(Path(runs["seeing"]) / "best.pt"), "val")
    assert np.isfinite(r["own"]) and r["own"] > 0
    assert r["other"] != r["own"]
