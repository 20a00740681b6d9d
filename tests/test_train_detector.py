"""train-detector: the bottom-up detector learns a dataset's boxes and its checkpoint extracts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.errors import CapstackError
from pipeline.features.detectors.checkpoints import load_detector
from pipeline.features.detectors.training import DetectorTraining, train_detector
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from pipeline.features.stores import open_store
from process_helpers import last_line, run_capstack

TINY = DetectorTraining(label_key="shape", attribute_key="color", epochs=1, batch_size=3,
                        image_size=64, proposals=20, train_proposals=40, rois=8)


SHAPES = dict(n_train=6, n_val=1, n_test=2, seed=3)  # conftest's shapes


@pytest.fixture(scope="module")
def trained(shapes, tmp_path_factory):
    root, dataset = shapes
    out = tmp_path_factory.mktemp("detector") / "detector.pth"
    return out, train_detector(dataset, root, out, TINY, progress=False)


def test_training_reports_coco_map_and_attribute_accuracy(shapes, trained):
    out, report = trained
    assert report["images"] == 2 and report["objects"] >= 1 and report["attributes"] >= 1
    assert 0.0 <= report["map"] <= report["map50"] <= 1.0
    assert report["attribute_accuracy"] is None or 0.0 <= report["attribute_accuracy"] <= 1.0
    written = json.loads(out.with_name(out.name + ".json").read_text())
    assert written["test"]["map50"] == report["map50"] and len(written["history"]) == 1
    assert set(written["history"][0]) >= {"rpn_objectness", "rpn_box", "classes", "box"}


def test_the_same_training_twice_writes_the_same_checkpoint_bytes(shapes, trained, tmp_path):
    """Its md5 names the region stores extracted with it: no clock, no absolute path inside
    (the time and the resolved dataset path are in the .json beside it)."""
    from pipeline.core.hashing import md5_of_file

    out, _ = trained
    root, dataset = shapes
    again = tmp_path / "elsewhere" / "detector.pth"
    again.parent.mkdir()
    train_detector(dataset, root, again, TINY, progress=False)
    assert md5_of_file(again) == md5_of_file(out)
    assert "train_seconds" in json.loads(again.with_name(again.name + ".json").read_text())


def test_the_attribute_loss_enters_the_sum_at_its_weight(shapes):
    """The same batch, model and draws: the attribute loss scales with attribute_weight and
    the other four losses do not move (the weight keeps colours from taking the features)."""
    from dataclasses import replace

    import torch

    from pipeline.captions.karpathy import load_karpathy
    from pipeline.features.detectors.detector import BottomUpDetector
    from pipeline.features.detectors.training import (detector_config, examples, label_names,
                                                      step_loss)

    root, dataset = shapes
    train = load_karpathy(dataset).split("train")
    objects = {n: k + 1 for k, n in enumerate(label_names(train, "shape", dataset))}
    colours = {n: k + 1 for k, n in enumerate(label_names(train, "color", dataset))}
    batch = examples(train, root, objects, colours, TINY, dataset, False)[:3]
    torch.manual_seed(0)
    model = BottomUpDetector(detector_config(TINY, len(objects), len(colours)),
                             frozen_norm=False).eval()  # batch norm's statistics stay put
    proposals = replace(model.config.proposals, pre_nms=100, post_nms=40)

    def losses(weight: float) -> dict[str, float]:
        torch.manual_seed(1)
        out = step_loss(model, batch, replace(TINY, attribute_weight=weight), proposals)
        return {k: v.item() for k, v in out.items()}

    whole, fifth = losses(1.0), losses(0.2)
    assert whole["attributes"] > 0
    assert fifth["attributes"] == pytest.approx(0.2 * whole["attributes"], rel=1e-6)
    assert {k: v for k, v in fifth.items() if k != "attributes"} == pytest.approx(
        {k: v for k, v in whole.items() if k != "attributes"}, rel=1e-6)


def test_the_checkpoint_loads_with_its_label_names(shapes, trained):
    out, _ = trained
    loaded = load_detector(out)
    names = json.loads(out.with_name(out.name + ".json").read_text())
    assert loaded.naming == "capstack" and loaded.objects == names["objects"]
    assert loaded.attributes == names["attributes"]
    config = loaded.detector.config
    assert config.num_classes == len(names["objects"]) + 1 and config.min_size == 64
    assert not loaded.detector.training


def test_extract_regions_detects_with_the_trained_detector(shapes, trained, tmp_path):
    root, dataset = shapes
    out, _ = trained
    settings = RegionSettings(arch="bottom-up", weights=str(out), min_boxes=2, max_boxes=4,
                              min_size=64, max_size=64)
    result = extract_regions(dataset, root, settings, root=tmp_path, batch_size=4, workers=0,
                             progress=False)
    store = open_store(result.store)
    about = store.meta["producer"]["about"]
    assert about["naming"] == "capstack" and about["objects"] == load_detector(out).objects
    for image_id in store.ids():
        record = store.get(image_id)
        assert 2 <= record.num <= 4 and record["attributes"].shape == (record.num, 1)


def test_a_dataset_without_labelled_boxes_is_refused(shapes, tmp_path):
    root, dataset = shapes
    data = json.loads(dataset.read_text())
    for image in data["images"]:
        image["boxes"] = [{"box": b["box"]} for b in image["boxes"]]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    with pytest.raises(CapstackError, match=f"{bare}: no boxes with a 'shape'"):
        train_detector(bare, root, tmp_path / "d.pth", TINY, progress=False)


def test_the_command_line_defaults_are_the_training_defaults():
    import cli

    command = cli.main.commands["train-detector"]
    defaults = DetectorTraining()
    names = {"batch": "batch_size"}
    for option in command.params:
        if option.name in ("dataset_json", "image_root", "out", "label_key", "attribute_key"):
            continue
        field = names.get(option.name, option.name)
        assert option.default == getattr(defaults, field), option.name


@pytest.mark.parametrize("box, problem", [
    ([40, 10, 20, 30], "[40, 10, 20, 30]: expected x2 > x1 and y2 > y1"),
    ([10, 10, float("nan"), 30], "holds a value that is not a finite number"),
    ([10, 10, 1e300, 30], "holds a value that is not a finite number"),
    ([10, 10, 30], "expected [x1, y1, x2, y2] (four numbers"),
    ("10 10 30 30", "expected [x1, y1, x2, y2] (four numbers"),
])
def test_a_malformed_box_is_refused_before_any_training(shapes, tmp_path, box, problem):
    """A box with x2 < x1 or a NaN once trained weights that were all NaN, reported mAP 0.000
    and exited 0; an extraction with them then skipped every image."""
    from pipeline.demo.backbone import BackboneTraining, train_backbone
    from pipeline.features.extract.kinds.region_base import given_boxes

    root, dataset = shapes
    data = json.loads(dataset.read_text())
    data["images"][1]["boxes"][0]["box"] = box
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    imgid = data["images"][1]["imgid"]
    where = f"{bad}: images[1] (imgid {imgid}).boxes[0]: "
    for train in (lambda: train_detector(bad, root, tmp_path / "d.pth", TINY, progress=False),
                  lambda: train_backbone(bad, root, tmp_path / "b.pth",
                                         BackboneTraining(epochs=1, crop_size=16)),
                  lambda: given_boxes(bad)):
        with pytest.raises(CapstackError) as refused:
            train()
        assert str(refused.value).startswith(where) and problem in str(refused.value)
    assert not (tmp_path / "d.pth").exists() and not (tmp_path / "b.pth").exists()


def test_a_nan_loss_stops_the_detector_training_before_anything_is_saved(shapes, tmp_path,
                                                                         monkeypatch):
    import torch

    from pipeline.features.detectors import training

    real = training.step_loss

    def diverged(*args):
        return {**real(*args), "box": torch.tensor(float("nan"))}

    monkeypatch.setattr(training, "step_loss", diverged)
    root, dataset = shapes
    with pytest.raises(CapstackError, match=r"train-detector: epoch 1, batch 1 \(images .*\): "
                                            r"loss box nan; stopped before anything was saved"):
        train_detector(dataset, root, tmp_path / "d.pth", TINY, progress=False)
    assert not (tmp_path / "d.pth").exists()


def test_detector_weights_holding_nan_are_refused_when_loaded(trained, tmp_path):
    import torch

    out, _ = trained
    checkpoint = torch.load(out, weights_only=True)
    key = "rpn.conv.weight"
    checkpoint["model"][key] = torch.full_like(checkpoint["model"][key], float("nan"))
    diverged = tmp_path / "diverged.pth"
    torch.save(checkpoint, diverged)
    with pytest.raises(CapstackError, match=f"{diverged}: rpn.conv.weight holds NaN or "
                                            f"infinite values"):
        load_detector(diverged)


def with_image_1(shapes, tmp_path: Path, change) -> Path:
    data = json.loads(shapes[1].read_text())
    change(data["images"][1])
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(data))
    return path


def unlabel(image: dict) -> None:
    image["boxes"] = [{"box": b["box"]} for b in image["boxes"]]


@pytest.mark.parametrize("change", [lambda im: im.update(boxes=[]), unlabel],
                         ids=["no boxes", "no labelled box"])
def test_an_image_without_labelled_boxes_is_left_out_of_a_detectors_training(shapes, tmp_path,
                                                                            change):
    """Was: IndexError: index is out of bounds for dimension with size 0."""
    from pipeline.features.detectors.training import DetectorTraining, train_detector

    root, _ = shapes
    dataset = with_image_1(shapes, tmp_path, change)
    cfg = DetectorTraining(label_key="shape", attribute_key="color", epochs=1, batch_size=3,
                           image_size=64, proposals=20, train_proposals=40, rois=8)
    result = train_detector(dataset, root, tmp_path / "d.pth", cfg, progress=False)
    assert result["without_boxes"] == 1 and (tmp_path / "d.pth").is_file()


@pytest.mark.parametrize("change, problem", [
    (lambda im: im.update(boxes="abc"), ".boxes: expected a list of boxes ([x1, y1, x2, y2], "
                                        "or {\"box\": [...], ...} with its labels), got 'abc'"),
    (lambda im: im.update(boxes=None), ".boxes: expected a list of boxes ([x1, y1, x2, y2], "
                                       "or {\"box\": [...], ...} with its labels), got None"),
    (lambda im: im["boxes"][0].update(shape=["a"]), ".boxes[0].shape: expected a name, got "
                                                    "['a']"),
    (lambda im: im["boxes"][0].update(box=[1000, 1000, 2000, 2000]),
     ".boxes[0]: [1000.0, 1000.0, 2000.0, 2000.0] lies wholly outside the image (64x64 "
     "pixels)"),
], ids=["a string", "null", "a list as a label", "wholly outside"])
def test_boxes_a_training_cannot_use_are_named(shapes, tmp_path, change, problem):
    """Was: TypeError ('NoneType' object is not iterable, unhashable type: 'list'), a string's
    letters read as boxes, ValueError: Coordinate 'right' is less than 'left'."""
    from pipeline.demo.backbone import BackboneTraining, train_backbone
    from pipeline.features.detectors.training import DetectorTraining, train_detector

    root, _ = shapes
    dataset = with_image_1(shapes, tmp_path, change)
    cfg = DetectorTraining(label_key="shape", attribute_key="color", epochs=1, batch_size=3,
                           image_size=64, proposals=20, train_proposals=40, rois=8)
    for train in (lambda: train_detector(dataset, root, tmp_path / "d.pth", cfg,
                                         progress=False),
                  lambda: train_backbone(dataset, root, tmp_path / "b.pth",
                                         BackboneTraining(epochs=1, crop_size=16))):
        with pytest.raises(CapstackError) as refused:
            train()
        assert str(refused.value) == f"{dataset}: images[1] (imgid 1){problem}"
    assert not (tmp_path / "d.pth").exists() and not (tmp_path / "b.pth").exists()


def test_a_given_box_wholly_outside_its_image_is_refused(shapes, tmp_path):
    root, _ = shapes
    dataset = with_image_1(shapes, tmp_path,
                           lambda im: im["boxes"][0].update(box=[100, 10, 120, 30]))
    result = run_capstack("extract-regions", dataset, root, "--arch", "c5", "--backbone",
                          "resnet18", "--weights", "random", "--boxes", "given", "--min-size",
                          64, "--max-size", 64, "--workers", 0, "--features-root",
                          tmp_path / "features", cwd=tmp_path)
    assert result.returncode == 1
    assert last_line(result) == (f"Error: {dataset}: image 1: boxes[0]: [100.0, 10.0, 120.0, "
                                 f"30.0] lies wholly outside the image (64x64 pixels)")
