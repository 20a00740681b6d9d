"""Region extraction end to end: given and detected boxes into real stores, via the CLI too."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.core.errors import CapstackError
from pipeline.features.extract.kinds.region_base import given_boxes
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from pipeline.features.stores import open_store

GIVEN = RegionSettings(arch="c5", backbone="resnet18", weights="random", boxes="given",
                       min_size=64, max_size=64, num_classes=2)
DETECT = RegionSettings(arch="c5", backbone="resnet18", weights="random", boxes="detect",
                        min_boxes=3, max_boxes=5, conf_thresh=0.2, min_size=64, max_size=64,
                        num_classes=4)


SHAPES = dict(n_train=6, n_val=1, n_test=1, seed=2)  # conftest's shapes


def extract(shapes, root, settings, **kw):
    image_root, dataset = shapes
    return extract_regions(dataset, image_root, settings, root=root, batch_size=3, workers=0,
                           progress=False, **kw)


def test_given_boxes_are_stored_with_one_feature_each(shapes, tmp_path):
    result = extract(shapes, tmp_path / "features", GIVEN)
    assert result.store.name.startswith("regions-resnet18-") and result.extracted == 8
    store = open_store(result.store)
    meta = store.meta
    assert meta["fields"] == {"features": {"shape": ["N", 512], "dtype": "float32"},
                              "boxes": {"shape": ["N", 4], "dtype": "float32"},
                              "scores": {"shape": ["N"], "dtype": "float32"},
                              "classes": {"shape": ["N"], "dtype": "int32"}}
    assert (meta["producer"]["name"], meta["producer"]["settings"]["boxes"]) == \
        ("extract-regions", "given")
    assert "layer4" in meta["producer"]["about"]["layer"] and "grid" not in meta
    for image_id, boxes in given_boxes(shapes[1]).items():
        record = store.get(image_id)
        assert record.features.shape == (len(boxes), 512) and record.features.dtype == np.float32
        np.testing.assert_allclose(record["boxes"], boxes)
        assert (record.height, record.width) == (64, 64)
        assert record["scores"].shape == record["classes"].shape == (len(boxes),)


def test_detected_boxes_respect_min_and_max(shapes, tmp_path):
    result = extract(shapes, tmp_path / "features", DETECT)
    store = open_store(result.store)
    assert store.meta["producer"]["settings"]["min_boxes"] == 3 and store.meta["count"] == 8
    for image_id in store.ids():
        record = store.get(image_id)
        n = record.features.shape[0]
        assert 3 <= n <= 5 and record["boxes"].shape == (n, 4)
        assert (record["boxes"][:, 2:] >= record["boxes"][:, :2]).all()
        assert (record["boxes"] >= 0).all() and (record["boxes"] <= 64).all()
        assert (np.diff(record["scores"].astype(np.float32)) <= 1e-6).all()  # best first


def test_box_settings_change_the_fingerprint_and_reuse_works(shapes, tmp_path):
    root = tmp_path / "features"
    first = extract(shapes, root, DETECT)
    again = extract(shapes, root, DETECT)
    fixed = extract(shapes, root, RegionSettings(**{**DETECT.__dict__, "min_boxes": 4,
                                                    "max_boxes": 4}))
    assert again.reused and again.store == first.store
    assert fixed.fingerprint != first.fingerprint
    assert all(open_store(fixed.store).get(i).features.shape[0] == 4 for i in range(8))


def test_given_boxes_edited_in_the_json_make_a_new_store(shapes, tmp_path):
    image_root, dataset = shapes
    data = json.loads(dataset.read_text())
    data["images"][0]["boxes"] = [{"box": [1, 2, 30, 40]}]
    edited = tmp_path / "dataset_edited.json"
    edited.write_text(json.dumps(data))
    first = extract(shapes, tmp_path / "features", GIVEN)
    other = extract_regions(edited, image_root, GIVEN, root=tmp_path / "features",
                            workers=0, progress=False)
    assert other.fingerprint != first.fingerprint
    np.testing.assert_allclose(open_store(other.store).get(0)["boxes"], [[1, 2, 30, 40]])


@pytest.mark.parametrize("boxes, problem", [
    (None, 'no "boxes" field'),
    ([[10, 10, 5, 20]], "x2 > x1"),
    ([[1, 2, 3]], "x1, y1, x2, y2"),
    ([[1, 2, 3], [1, 2, 3, 4]], "list of"),
])
def test_bad_given_boxes_name_the_file_and_image(shapes, tmp_path, boxes, problem):
    data = json.loads(shapes[1].read_text())
    if boxes is None:
        del data["images"][1]["boxes"]
    else:
        data["images"][1]["boxes"] = boxes
    bad = tmp_path / "dataset_bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(CapstackError, match=problem) as error:
        extract_regions(bad, shapes[0], GIVEN, root=tmp_path, workers=0, progress=False)
    assert str(bad) in str(error.value) and "imgid 1" in str(error.value)


def test_missing_detector_weights_say_where_to_put_them(shapes, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(CapstackError, match="fasterrcnn_resnet50_fpn_coco"):
        extract(shapes, tmp_path, RegionSettings())
    with pytest.raises(CapstackError, match="not found"):
        extract(shapes, tmp_path, RegionSettings(weights=str(tmp_path / "nope.pth")))


def test_bad_box_counts_are_refused(shapes, tmp_path):
    with pytest.raises(CapstackError, match="min <= max"):
        extract(shapes, tmp_path, RegionSettings(**{**DETECT.__dict__, "min_boxes": 9}))


def test_cli_extract_regions_writes_a_pointer(shapes, tmp_path, capstack):
    image_root, dataset = shapes
    pointer = tmp_path / "regions.json"
    result = capstack("extract-regions", dataset, image_root, "--arch", "c5", "--backbone",
                      "resnet18", "--weights", "random", "--boxes", "given", "--min-size", 64,
                      "--max-size", 64, "--num-classes", 2, "--features-root", tmp_path / "f",
                      "--pointer", pointer, "--workers", 0)
    store = json.loads(pointer.read_text())["store"]
    assert store in result.output and open_store(store).meta["count"] == 8
