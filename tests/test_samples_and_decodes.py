"""benchmarks/samples_and_decodes.py: the greedy side is what evaluation decodes and scores; the
sampled side is drawn as SCST draws, and repeats from its seed."""

from __future__ import annotations


import numpy as np
import pytest

from pipeline.captions.prepared import load_captions
from trainer.checkpoint import load_checkpoint
from trainer.config import load_experiment
from trainer.data import Features, eval_batches
from trainer.evaluation.loaded import load_model
from trainer.evaluation.predict import predict
from trainer.rewards.cider_cache import build_cache
from trainer.train import train
from scripts import load_script
from trainer_fixtures import prepared_with_grid, write_experiment



def samples_and_decodes():
    return load_script("benchmarks/samples_and_decodes.py").samples_and_decodes


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("samples")
    prepared, store = prepared_with_grid(root)
    exp = write_experiment(root / "xe.yaml", decoder="show_tell", captions=prepared,
                           features=[store], epochs=2)
    train(load_experiment(exp), root / "xe", progress=False)
    build_cache(prepared, "train", root / "cider.npz")
    return root / "xe" / "best.pt", root / "cider.npz"


def test_the_greedy_side_is_evaluations_greedy_decode_scored(run):
    checkpoint, cache = run
    found = samples_and_decodes()(str(checkpoint), "train", 3, str(cache))
    model, vocab, config = load_model(load_checkpoint(checkpoint))
    captions = load_captions(config.data.captions)
    features = Features(config.data.features, config.data.max_regions, config.data.box_geometry)
    preds = predict(model, vocab, eval_batches(captions, features, "train", 7), "cpu",
                    beam_size=1, max_len=config.train.max_len)
    assert found["greedy"]["length"] == pytest.approx(np.mean([len(p.words) for p in preds]))
    for side in ("samples", "greedy"):
        assert 0 <= found[side]["BLEU-4"] <= 1 and found[side]["CIDEr-D"] >= 0


def test_the_samples_repeat_from_their_seed_and_differ_from_the_decode(run):
    checkpoint, cache = run
    measure = samples_and_decodes()
    first = measure(str(checkpoint), "train", 3, str(cache))
    assert measure(str(checkpoint), "train", 3, str(cache)) == first
    assert first["samples"] != first["greedy"]  # sampled at temperature 1, with dropout
