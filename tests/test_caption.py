"""capstack caption: raw images -> the store's own extractor -> the checkpoint's decoder."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.features.extract.backbones import build_resnet
from pipeline.features.extract.grid import GridSettings, extract_grid
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from trainer.config import load_experiment
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.train import train
from trainer_fixtures import make_prepared, write_experiment


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny shapes dataset, grid features from saved resnet18 weights, a trained soft_attention."""
    root = tmp_path_factory.mktemp("caption")
    dataset, prepared = make_prepared(root)
    torch.manual_seed(0)
    weights = root / "resnet18.pth"
    torch.save(build_resnet("resnet18").state_dict(), weights)
    grid = extract_grid(dataset, dataset.parent, GridSettings("resnet18", str(weights), 64, 2),
                        root=root / "features", pointer=root / "grid.json", workers=0,
                        progress=False)
    exp = write_experiment(root / "soft.yaml", decoder="soft_attention", captions=prepared,
                           features=[root / "grid.json"], epochs=1)
    train(load_experiment(exp), root / "run", progress=False)
    return root, dataset, prepared, weights, grid.store


@pytest.mark.slow
def test_caption_matches_the_evaluation_of_the_same_images(setup, capstack, tmp_path):
    root, dataset, prepared, _, _ = setup
    evaluated = evaluate_checkpoint(root / "run", tmp_path / "eval", beam_size=3, figures=0)
    assert evaluated["images"] == 4
    results = json.loads((tmp_path / "eval" / "results_test.json").read_text())
    test_files = json.loads((prepared / "images_test.json").read_text())
    files = [dataset.parent / e["filepath"] / e["filename"] for e in test_files[:2]]
    out = capstack("caption", "--checkpoint", root / "run", *files, "--beam", 3,
                   "--attention", tmp_path / "att.png").output.splitlines()
    expected = {r["image_id"]: r["caption"] for r in results}
    for line, entry in zip(out, test_files[:2]):
        assert line.startswith(str(dataset.parent / entry["filepath"] / entry["filename"]))
        assert line.split(": ", 1)[1].split("  [")[0] == expected[entry["image_id"]]
    assert (tmp_path / "att_0.png").is_file() and (tmp_path / "att_1.png").is_file()


def test_caption_refuses_when_the_weights_changed_or_went(setup, capstack, tmp_path):
    root, dataset, _, weights, _ = setup
    image = next((dataset.parent / "images").glob("*.png"))
    saved = weights.read_bytes()
    try:
        state = torch.load(weights, weights_only=True)
        state["conv1.weight"] += 1
        torch.save(state, weights)
        result = capstack("caption", "--checkpoint", root / "run", image, expect_ok=False)
        assert result.exit_code == 1 and "changed since the features were extracted" in result.output
        weights.unlink()
        result = capstack("caption", "--checkpoint", root / "run", image, expect_ok=False)
        assert "which are not here" in result.output and str(weights) in result.output
    finally:
        weights.write_bytes(saved)


def test_caption_refuses_given_box_regions_and_runs_detected_ones(setup, tmp_path, capstack):
    root, dataset, prepared, _, _ = setup
    image = next((dataset.parent / "images").glob("*.png"))
    runs = {}
    for boxes in ("given", "detect"):
        settings = RegionSettings(arch="c5", backbone="resnet18", weights="random", boxes=boxes,
                                  min_boxes=2, max_boxes=3, min_size=64, max_size=64,
                                  num_classes=3)
        extract_regions(dataset, dataset.parent, settings, root=tmp_path / "features",
                        pointer=tmp_path / f"{boxes}.json", workers=0, progress=False)
        exp = write_experiment(tmp_path / f"{boxes}.yaml", decoder="top_down",
                               captions=prepared, features=[tmp_path / f"{boxes}.json"], epochs=1)
        train(load_experiment(exp), tmp_path / boxes, progress=False)
        runs[boxes] = tmp_path / boxes
    refused = capstack("caption", "--checkpoint", runs["given"], image, expect_ok=False)
    assert "--boxes given" in refused.output and "new images have none" in refused.output
    out = capstack("caption", "--checkpoint", runs["detect"], image, "--attention",
                   tmp_path / "regions.png").output
    assert out.startswith(f"{image}: ") and (tmp_path / "regions.png").is_file()


def test_caption_of_an_unreadable_image_names_it(setup, capstack, tmp_path):
    root = setup[0]
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    result = capstack("caption", "--checkpoint", root / "run", bad, expect_ok=False)
    assert result.exit_code == 1 and str(bad) in result.output
