"""Bottom-up detector checkpoints: every naming loads to the same regions, bad files are refused.

A tiny random detector is written as MILVLG's bua-caffe ``.pth``, airsplay's
detectron2 ``.pkl`` and a bare ``pytorch_model.bin``, and as capstack's own
checkpoint; each must give exactly the regions of the model it came from.
Damaged or foreign files are refused naming the file and the keys as the file
spells them; a hostile pickle is never run. Last, ``extract_regions`` end to end
on the shapes dataset with ``--arch bottom-up``.
"""

from __future__ import annotations

import hashlib
import pickle
import re
from typing import Any

import numpy as np
import pytest
import torch
from torchvision.models import resnet18

from pipeline.core.errors import CapstackError
from pipeline.core.safe_pickle import RefusedPickle
from pipeline.features.detectors import checkpoints
from pipeline.features.detectors.caffe_resnet import ResNetShape
from pipeline.features.detectors.detector import BottomUpDetector, DetectorConfig
from pipeline.features.detectors.regions import BottomUpRegions
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from pipeline.features.stores import open_store

CONFIG = DetectorConfig(resnet=ResNetShape(blocks=(1, 1, 1, 1), width=8), num_classes=6,
                        num_attributes=5, rpn_channels=16, min_size=64, max_size=96)
SIZES: dict[str, Any] = {"min_size": 64, "max_size": 96}  # load_detector keywords
FIELDS = ("features", "boxes", "scores", "classes", "attributes", "attribute_scores")
OBJECTS = ["cat", "dog", "tree", "sky, heavens", "car"]
ATTRIBUTES = ["red", "tall", "wooden", "blue"]


# --------------------------------------------------------------------------- helpers

def random_detector(seed: int = 0, config: DetectorConfig = CONFIG) -> BottomUpDetector:
    """The tiny VG-shaped detector with every saved weight and norm buffer random (the
    anchors, a buffer no checkpoint holds, stay Caffe's)."""
    torch.manual_seed(seed)
    model = BottomUpDetector(config)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("running_var"):
                t.uniform_(0.5, 2.0)
            elif name.endswith("norm.weight"):
                t.normal_(1.0, 0.1)
            elif name.startswith("rpn.deltas."):  # proposals near their anchors: a dozen
                t.normal_(0.0, 0.025)               # survive NMS on a 64-px image
            else:
                t.normal_(0.0, 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def model() -> BottomUpDetector:
    return random_detector()


@pytest.fixture(scope="module")
def images() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.rand(3, 40, 60, generator=gen), torch.rand(3, 50, 40, generator=gen)]


def regions_of(detector: BottomUpDetector, images) -> list[dict]:
    return BottomUpRegions(detector, min_boxes=3, max_boxes=8, top_attributes=2)(images)


@pytest.fixture(scope="module")
def expected(model, images) -> list[dict]:
    """The original model's regions: enough of them, and distinct, for the comparisons to bite."""
    out = regions_of(model, images)
    for region in out:
        n = len(region["boxes"])
        assert 3 <= n <= 8 and region["attributes"].shape == (n, 2)
        assert len(set(map(tuple, region["boxes"].tolist()))) == n
        assert (region["features"][1:] != region["features"][0]).any(dim=1).all()
    return out


def assert_same_regions(got: list[dict], want: list[dict]):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert set(g) == set(FIELDS) == set(w)
        for name in FIELDS:
            assert g[name].shape == w[name].shape and g[name].dtype == w[name].dtype, name
            torch.testing.assert_close(g[name], w[name], rtol=0, atol=1e-6, msg=name)


def save_pth(state: dict, path):
    torch.save({"model": state}, path)
    return path


def save_pkl(state: dict, path):
    with open(path, "wb") as f:
        pickle.dump({"model": {k: v.numpy() for k, v in state.items()}, "__author__": "test"}, f)
    return path


def save_bin(state: dict, path):
    """A bare state dict with the norm counters a HuggingFace / mmf file carries."""
    state = dict(state)
    for key in list(state):
        if key.endswith("running_var"):
            state[key[:-len("running_var")] + "num_batches_tracked"] = torch.tensor(0)
    torch.save(state, path)
    return path


def refused(path, *patterns: str) -> str:
    """The CapstackError loading ``path`` raises; it names the file and every pattern."""
    with pytest.raises(CapstackError) as error:
        checkpoints.load_detector(path, **SIZES)
    message = str(error.value)
    assert str(path.resolve()) in message
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)
    return message


# --------------------------------------------------------------------------- namings

def test_the_three_files_load_to_the_models_regions(model, images, expected, tmp_path):
    bua = save_pth(checkpoints.in_naming(model, "bua-caffe"), tmp_path / "bua.pth")
    d2 = checkpoints.in_naming(model, "detectron2")
    pkl = save_pkl(d2, tmp_path / "faster_rcnn_from_caffe_attr.pkl")
    hf = save_bin(d2, tmp_path / "pytorch_model.bin")
    assert all(isinstance(v, torch.Tensor) for v in torch.load(hf).values())

    for path, naming in ((bua, "bua-caffe"), (pkl, "detectron2"), (hf, "detectron2")):
        loaded = checkpoints.load_detector(path, **SIZES)
        assert loaded.naming == naming and loaded.path == str(path.resolve())
        assert loaded.md5 == hashlib.md5(path.read_bytes()).hexdigest()
        assert loaded.detector.config == CONFIG
        assert not loaded.detector.training
        assert_same_regions(regions_of(loaded.detector, images), expected)
        assert loaded.about() == {"checkpoint": str(path.resolve()), "checkpoint_md5": loaded.md5,
                                  "naming": naming, "conversions": loaded.conversions}


def test_the_conversions_are_listed(model, tmp_path):
    bua = checkpoints.load_detector(
        save_pth(checkpoints.in_naming(model, "bua-caffe"), tmp_path / "bua.pth"), **SIZES)
    assert len(bua.conversions) == 1 and bua.conversions[0].startswith("objectness: softmax")
    d2 = checkpoints.load_detector(
        save_pkl(checkpoints.in_naming(model, "detectron2"), tmp_path / "d2.pkl"), **SIZES)
    assert len(d2.conversions) == 3
    # size-major (scale s, ratio r at row 3 s + r) back to ratio-major (row 4 r + s)
    assert "anchors reordered to Caffe's ratio-major order [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, " \
           "11]" in d2.conversions[0]
    assert "moved from the last row to row 0" in d2.conversions[1]
    assert "box weights (10.0, 10.0, 5.0, 5.0)" in d2.conversions[2]


def test_the_weights_land_where_caffe_has_them(model, tmp_path):
    """The conversions by hand: one logit per anchor, background row first, unscaled deltas."""
    d2 = checkpoints.in_naming(model, "detectron2")
    bua = checkpoints.in_naming(model, "bua-caffe")
    pairs = bua["proposal_generator.rpn_head.objectness_logits.bias"]
    assert pairs.shape == (24,) and (pairs[:12] == 0).all()  # background block, then foreground
    scores = d2["roi_heads.box_predictor.cls_score.bias"]
    assert torch.equal(scores[-1], model.predictor.cls_score.bias[0])  # background last
    bbox = d2["roi_heads.box_predictor.bbox_pred.bias"]
    assert bbox.shape == (20,)  # foreground rows only, scaled by (10, 10, 5, 5)
    torch.testing.assert_close(bbox[:4], model.predictor.bbox_pred.bias[4:8] *
                               torch.tensor([10.0, 10.0, 5.0, 5.0]))
    logits = d2["proposal_generator.rpn_head.objectness_logits.bias"]
    for r in range(3):
        for s in range(4):  # the file: size-major; the model: ratio-major
            assert logits[s * 3 + r] == model.rpn.objectness.bias[r * 4 + s]

    loaded = checkpoints.load_detector(save_pkl(d2, tmp_path / "d2.pkl"), **SIZES).detector
    state, original = loaded.state_dict(), model.state_dict()
    assert set(state) == set(original)
    for key, value in original.items():
        if key.startswith("predictor.bbox_pred"):
            torch.testing.assert_close(state[key][4:], value[4:])  # / 10, / 5: not bit-exact
            assert (state[key][:4] == 0).all()  # background rows: zeros
        else:
            assert torch.equal(state[key], value), key


def test_detectron2_file_without_anchors_uses_the_size_major_order(model, images, expected,
                                                                   tmp_path):
    state = checkpoints.in_naming(model, "detectron2")
    del state[checkpoints.ANCHORS_KEY]
    loaded = checkpoints.load_detector(save_pkl(state, tmp_path / "no_anchors.pkl"), **SIZES)
    assert "anchors reordered" in loaded.conversions[0]
    assert_same_regions(regions_of(loaded.detector, images), expected)


def test_bua_caffe_file_anchors_in_another_order_are_matched(model, images, expected, tmp_path):
    """A file that carries its anchors is read by them, whatever its naming's default order."""
    state = checkpoints.in_naming(model, "bua-caffe")
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    state[checkpoints.ANCHORS_KEY] = state[checkpoints.ANCHORS_KEY][perm]
    for name in ("weight", "bias"):
        key = f"proposal_generator.rpn_head.objectness_logits.{name}"
        pairs = state[key]
        state[key] = torch.cat([pairs[:12][perm], pairs[12:][perm]])
        key = f"proposal_generator.rpn_head.anchor_deltas.{name}"
        t = state[key]
        state[key] = t.reshape(12, 4, *t.shape[1:])[perm].reshape(t.shape)
    loaded = checkpoints.load_detector(save_pth(state, tmp_path / "perm.pth"), **SIZES)
    assert any("anchors reordered" in c for c in loaded.conversions)
    assert_same_regions(regions_of(loaded.detector, images), expected)


def test_bua_caffe_class_embedding_with_one_extra_row(model, images, expected, tmp_path):
    state = checkpoints.in_naming(model, "bua-caffe")
    key = "roi_heads.box_predictor.cls_embed.weight"
    state[key] = torch.cat([state[key], torch.randn(1, state[key].shape[1])])
    assert state[key].shape[0] == state["roi_heads.box_predictor.cls_score.weight"].shape[0] + 1
    loaded = checkpoints.load_detector(save_pth(state, tmp_path / "extra_row.pth"), **SIZES)
    assert "class embedding: 7 rows, the last never read, dropped" in loaded.conversions
    assert_same_regions(regions_of(loaded.detector, images), expected)


def test_capstack_checkpoint_keeps_config_and_labels(model, images, expected, tmp_path):
    path = tmp_path / "detector.pt"
    checkpoints.save_capstack(model, path, objects=OBJECTS, attributes=ATTRIBUTES)
    loaded = checkpoints.load_detector(path)
    assert loaded.naming == "capstack" and loaded.conversions == []
    assert loaded.detector.config == CONFIG
    assert (loaded.objects, loaded.attributes) == (OBJECTS, ATTRIBUTES)
    assert_same_regions(regions_of(loaded.detector, images), expected)
    resized = checkpoints.load_detector(path, min_size=80, max_size=120).detector.config
    assert (resized.min_size, resized.max_size) == (80, 120) and resized.resnet == CONFIG.resnet


# --------------------------------------------------------------------------- refusals

def test_missing_file_names_it_and_where_to_get_one(tmp_path):
    message = refused(tmp_path / "nowhere.pth", "not found",
                      re.escape("bua-caffe-frcn-r101_with_attributes.pth"),
                      re.escape("faster_rcnn_from_caffe_attr.pkl"), "MILVLG", "airsplay")
    assert "--weights" in message


@pytest.mark.parametrize("naming, key", [
    ("bua-caffe", "roi_heads.res5.0.conv1.weight"),
    ("bua-caffe", "backbone.res3.0.conv2.norm.running_var"),
    ("detectron2", "roi_heads.box_predictor.fc_attr.bias"),
    ("detectron2", "proposal_generator.rpn_head.anchor_deltas.weight"),
])
def test_a_removed_key_is_named_as_the_file_spells_it(model, tmp_path, naming, key):
    state = checkpoints.in_naming(model, naming)
    del state[key]
    refused(save_pth(state, tmp_path / "missing.pth"), f"naming {naming}",
            "missing keys " + re.escape(key))


@pytest.mark.parametrize("key", ["proposal_generator.rpn_head.objectness_logits.weight",
                                 "roi_heads.box_predictor.cls_score.weight",
                                 "roi_heads.box_predictor.attr_linear2.weight"])
def test_a_removed_key_the_config_needs_is_named_as_the_file_spells_it(model, tmp_path, key):
    state = checkpoints.in_naming(model, "bua-caffe")
    del state[key]
    refused(save_pth(state, tmp_path / "missing.pth"), "missing keys " + re.escape(key))


@pytest.mark.parametrize("key", ["roi_heads.box_predictor.extra.weight",
                                 "backbone.res2.0.conv1.extra", "some.other.thing",
                                 "backbone.res3.7.conv1.weight"])
def test_an_extra_key_is_named(model, tmp_path, key):
    state = checkpoints.in_naming(model, "bua-caffe")
    state[key] = torch.zeros(3)
    refused(save_pth(state, tmp_path / "extra.pth"), "unexpected keys " + re.escape(key))


def test_a_wrong_class_count_is_a_shape_mismatch(model, tmp_path):
    state = checkpoints.in_naming(model, "bua-caffe")
    dim = CONFIG.feature_dim
    state["roi_heads.box_predictor.cls_score.weight"] = torch.randn(7, dim)  # 7 classes, not 6
    state["roi_heads.box_predictor.cls_score.bias"] = torch.randn(7)
    refused(save_pth(state, tmp_path / "classes.pth"), r"shape mismatch \(file vs model\)",
            re.escape(f"roi_heads.box_predictor.bbox_pred.weight [24, {dim}] vs [28, {dim}]"))

    state = checkpoints.in_naming(model, "bua-caffe")
    state["roi_heads.box_predictor.bbox_pred.bias"] = torch.randn(20)
    refused(save_pth(state, tmp_path / "boxes.pth"), "shape mismatch",
            re.escape("roi_heads.box_predictor.bbox_pred.bias [20] vs [24]"))


def test_a_torchvision_state_dict_is_not_a_bottom_up_checkpoint(tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(resnet18().state_dict(), path)
    refused(path, "not a bottom-up detector checkpoint", "first keys: bn1.bias")


def test_a_pickle_that_would_run_a_command_is_refused_unrun(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            import os
            return os.system, (f"touch {marker}",)

    path = tmp_path / "evil.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"backbone.stem.conv1.weight": Evil()}}, f)
    with pytest.raises(RefusedPickle, match=r"refusing to unpickle (posix|nt|os)\.system"):
        checkpoints.load_detector(path, **SIZES)
    assert not marker.exists()


def test_anchors_other_than_the_vg_ones_are_refused(model, tmp_path):
    state = checkpoints.in_naming(model, "bua-caffe")
    state[checkpoints.ANCHORS_KEY] = torch.tensor([[-4.0, -4.0, 4.0, 4.0]]).repeat(12, 1)
    refused(save_pth(state, tmp_path / "anchors.pth"), re.escape(checkpoints.ANCHORS_KEY),
            "not the VG model's")
    state[checkpoints.ANCHORS_KEY] = torch.zeros(9, 4)
    refused(save_pth(state, tmp_path / "nine.pth"), re.escape(checkpoints.ANCHORS_KEY),
            r"shape \[9, 4\]")


def test_not_a_dict_of_tensors_is_refused(tmp_path):
    path = tmp_path / "list.pth"
    torch.save([1, 2, 3], path)
    refused(path, "not a checkpoint")
    path = tmp_path / "junk.pth"
    path.write_bytes(b"not a torch file")
    refused(path, "cannot read a checkpoint")


# --------------------------------------------------------------------------- extraction

SHAPES = dict(n_train=4, n_val=1, n_test=1, seed=2)  # conftest's shapes


def vocab(path, names):
    path.write_text("\n".join(names) + "\n", encoding="utf-8")
    return str(path)


def bottom_up_settings(weights, tmp_path, **kw):  # a RegionSettings (a function: no type)
    return RegionSettings(**{"arch": "bottom-up", "weights": str(weights), "min_boxes": 3,
                             "max_boxes": 5, "min_size": 64, "max_size": 96, "top_attributes": 2,
                             "objects_vocab": vocab(tmp_path / "objects_vocab.txt", OBJECTS),
                             "attributes_vocab": vocab(tmp_path / "attributes_vocab.txt",
                                                       ATTRIBUTES), **kw})


def run_extraction(shapes, settings, tmp_path):
    image_root, dataset = shapes
    return extract_regions(dataset, image_root, settings, root=tmp_path / "features",
                           batch_size=3, workers=0, progress=False)


def test_extract_regions_with_the_bottom_up_detector(model, shapes, tmp_path):
    bua = save_pth(checkpoints.in_naming(model, "bua-caffe"), tmp_path / "bua.pth")
    result = run_extraction(shapes, bottom_up_settings(bua, tmp_path), tmp_path)
    assert result.store.name.startswith("regions-bottom-up-r14-") and result.extracted == 6
    store = open_store(result.store)
    meta = store.meta
    assert meta["fields"]["attributes"] == {"shape": ["N", 2], "dtype": "int32"}
    assert meta["fields"]["attribute_scores"] == {"shape": ["N", 2], "dtype": "float32"}
    assert meta["fields"]["features"] == {"shape": ["N", CONFIG.feature_dim], "dtype": "float16"}
    about = meta["producer"]["about"]
    assert about["checkpoint"] == str(bua.resolve()) and about["naming"] == "bua-caffe"
    assert about["checkpoint_md5"] == hashlib.md5(bua.read_bytes()).hexdigest()
    assert about["objects"] == OBJECTS and about["attributes"] == ATTRIBUTES
    assert about["conversions"] and "ROIPool 14x14" in about["layer"]
    assert meta["producer"]["settings"]["naming"] == "bua-caffe"
    for image_id in store.ids():
        record = store.get(image_id)
        n = record.num
        assert 3 <= n <= 5 and record["boxes"].shape == (n, 4)
        assert record["attributes"].shape == (n, 2) and record["attributes"].dtype == np.int32
        assert record["attribute_scores"].shape == (n, 2)
        assert record["attribute_scores"].dtype == np.float32
        assert ((record["attributes"] >= 1) & (record["attributes"] <= 4)).all()
        assert (record["attributes"][:, 0] != record["attributes"][:, 1]).all()
        assert (record["attribute_scores"][:, 0] >= record["attribute_scores"][:, 1]).all()
        assert ((record["classes"] >= 1) & (record["classes"] <= 5)).all()
        assert (record["boxes"] >= 0).all() and (record["boxes"] <= 64).all()

    d2 = save_pkl(checkpoints.in_naming(model, "detectron2"), tmp_path / "d2.pkl")
    other = run_extraction(shapes, bottom_up_settings(d2, tmp_path), tmp_path)
    assert other.fingerprint != result.fingerprint and other.store != result.store
    other_store = open_store(other.store)
    assert other_store.meta["producer"]["about"]["naming"] == "detectron2"
    assert sorted(other_store.ids()) == sorted(store.ids())
    for image_id in store.ids():
        a, b = store.get(image_id), other_store.get(image_id)
        for name in ("features", "boxes", "scores", "classes", "attributes", "attribute_scores"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_extract_regions_refuses_a_vocabulary_of_the_wrong_length(model, shapes, tmp_path):
    bua = save_pth(checkpoints.in_naming(model, "bua-caffe"), tmp_path / "bua.pth")
    short = vocab(tmp_path / "short_objects.txt", OBJECTS[:4])
    with pytest.raises(CapstackError, match=re.escape(short) + ": 4 object names, the detector "
                                                               "has 5"):
        run_extraction(shapes, bottom_up_settings(bua, tmp_path, objects_vocab=short), tmp_path)
    long = vocab(tmp_path / "long_attributes.txt", ATTRIBUTES + ["green"])
    with pytest.raises(CapstackError, match=re.escape(long) + ": 5 attribute names"):
        run_extraction(shapes, bottom_up_settings(bua, tmp_path, attributes_vocab=long), tmp_path)


def test_bottom_up_without_weights_is_refused(shapes, tmp_path, capstack):
    with pytest.raises(CapstackError, match="bottom-up detector checkpoint not found.*"
                                            "bua-caffe-frcn-r101_with_attributes.pth"):
        run_extraction(shapes, RegionSettings(arch="bottom-up"), tmp_path)
    with pytest.raises(CapstackError, match="checkpoint not found"):
        run_extraction(shapes, RegionSettings(arch="bottom-up", weights="random"), tmp_path)
    image_root, dataset = shapes
    result = capstack("extract-regions", dataset, image_root, "--arch", "bottom-up",
                      "--features-root", tmp_path / "f", "--workers", 0, expect_ok=False)
    assert result.exit_code != 0
    assert "bottom-up detector checkpoint not found" in result.output
    assert "faster_rcnn_from_caffe_attr.pkl" in result.output
