"""Grid extraction end to end on small random networks: shapes, sharing, bad files, kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.extract.kinds.grid import GridSettings, extract_grid
from pipeline.features.stores import open_store
from process_helpers import committed_records, wait_for

SETTINGS = GridSettings(backbone="resnet18", weights="random", image_size=64, grid=2)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "shapes"
    write_shapes_dataset(root, n_train=10, n_val=2, n_test=2, seed=1, size=64)
    return root, root / "dataset_shapes.json"


def extract(shapes, root, settings=SETTINGS, batch_size=4, **kw):
    image_root, dataset = shapes
    return extract_grid(dataset, image_root, settings, root=root, batch_size=batch_size,
                        workers=0, progress=False, **kw)


def test_grid_records_have_the_expected_shapes(shapes, tmp_path):
    result = extract(shapes, tmp_path / "features", pointer=tmp_path / "grid.json")
    assert not result.reused and result.extracted == 14 and result.skipped == 0
    assert result.store.name.startswith("grid-resnet18-") and result.store.suffix == ".lmdb"
    store = open_store(result.store)
    meta = store.meta
    producer = meta["producer"]
    assert (producer["name"], producer["settings"]["backbone"], meta["grid"]) == \
        ("extract-grid", "resnet18", 2)
    assert meta["fields"] == {"features": {"shape": ["N", 512], "dtype": "float32"}}  # random
    assert producer["about"]["weights"] == "random" and meta["count"] == 14
    assert "kind" not in meta and "settings" not in meta  # the settings once, in the producer
    record = store.get(0)
    assert record.features.shape == (4, 512) and (record.height, record.width) == (64, 64)
    assert json.loads((tmp_path / "grid.json").read_text())["store"] == str(result.store)


def test_layer3_pools_the_stride_16_map(shapes, tmp_path):
    """Show-Attend-Tell's grid from a ResNet: layer3, 4x4 at 64 px here (14x14 at 224)."""
    import torch

    from pipeline.vision.backbones import load_resnet, resnet_body, resolve_weights
    from pipeline.vision.images import grid_transform, load_rgb

    settings = GridSettings("resnet18", "random", 64, grid=2, dtype="float32", layer="layer3")
    store = open_store(extract(shapes, tmp_path, settings, device="cpu").store)  # float32 as below
    producer = store.meta["producer"]
    assert (producer["settings"]["layer"], producer["settings"]["layer_map"]) == ("layer3", 4)
    assert store.meta["fields"]["features"]["shape"] == ["N", 256]  # resnet18's layer3
    assert "layer3 (4x4 at 64 px)" in producer["about"]["layer"]
    model = load_resnet("resnet18", resolve_weights("resnet18", "random")).eval()
    image = grid_transform(64)(load_rgb(shapes[0] / "images" / "shapes_000000.png"))
    with torch.no_grad():
        fmap = resnet_body(model, "layer3")(image[None])
    assert fmap.shape[-2:] == (4, 4)
    expected = torch.nn.functional.adaptive_avg_pool2d(fmap, 2).flatten(2).transpose(1, 2)[0]
    assert np.allclose(store.get(0).features, expected.numpy(), atol=1e-4)


@pytest.mark.slow  # VGG-19 built twice
def test_vgg19_conv5_4_is_show_attend_tells_grid(shapes, tmp_path):
    """--backbone vgg19 --layer conv5_4: VGG-19's 4th conv of the 5th block with its ReLU,
    before the 5th pool (stride 16: 4x4 at 64 px, 14x14x512 at 224), pooled; the user's
    state_dict loads without its classifier, and a ResNet layer is refused for it."""
    import torch

    from pipeline.vision.backbones import Weights, build_vgg, load_vgg
    from pipeline.vision.images import grid_transform, load_rgb

    weights = tmp_path / "vgg19.pth"
    torch.manual_seed(5)
    features = {k: v for k, v in build_vgg("vgg19").state_dict().items()
                if k.startswith("features.")}  # no classifier: only the convolutions are used
    torch.save(features, weights)
    settings = GridSettings("vgg19", str(weights), 64, grid=2, dtype="float32", layer="conv5_4")
    store = open_store(extract(shapes, tmp_path / "f", settings).store)
    producer = store.meta["producer"]
    assert (producer["settings"]["layer"], producer["settings"]["layer_map"]) == ("conv5_4", 4)
    assert store.meta["fields"]["features"]["shape"] == ["N", 512]
    model = load_vgg("vgg19", Weights(str(weights), "md5")).eval()
    trunk = model.features[:36]
    assert isinstance(trunk[-1], torch.nn.ReLU) and trunk[-2].out_channels == 512
    image = grid_transform(64)(load_rgb(shapes[0] / "images" / "shapes_000000.png"))
    with torch.no_grad():
        fmap = trunk(image[None])
    assert fmap.shape[-2:] == (4, 4)
    expected = torch.nn.functional.adaptive_avg_pool2d(fmap, 2).flatten(2).transpose(1, 2)[0]
    assert np.allclose(store.get(0).features, expected.numpy(), atol=1e-4)
    with pytest.raises(CapstackError, match="--layer layer3 is not a layer of vgg19 "
                                            r"\(choose conv5_4\)"):
        extract(shapes, tmp_path / "g", GridSettings("vgg19", "random", 64, 2, layer="layer3"))
    with pytest.raises(CapstackError, match="--layer conv5_4 is not a layer of resnet18"):
        extract(shapes, tmp_path / "g", GridSettings("resnet18", "random", 64, 2,
                                                      layer="conv5_4"))


def test_an_unknown_layer_is_refused(shapes, tmp_path):
    with pytest.raises(CapstackError, match="unknown grid layer 'layer2'"):
        extract(shapes, tmp_path, GridSettings("resnet18", "random", 64, 2, layer="layer2"))


def test_same_settings_reuse_the_store_other_settings_do_not(shapes, tmp_path):
    root = tmp_path / "features"
    first = extract(shapes, root, pointer=tmp_path / "a.json")
    again = extract(shapes, root, pointer=tmp_path / "b.json")
    assert again.reused and again.store == first.store and again.fingerprint == first.fingerprint
    users = json.loads(first.store.with_name(first.store.name + ".users.json").read_text())
    assert len(users) == 2
    other = extract(shapes, root, GridSettings("resnet18", "random", 64, grid=1))
    assert other.fingerprint != first.fingerprint and not other.reused


def test_fingerprint_follows_every_setting_and_the_images(shapes, tmp_path, monkeypatch):
    from pipeline.features.extract import job as job_module

    def plan_only(job, dataset, path, meta, *args):  # fingerprint without extracting
        return job_module.JobResult(path, meta["fingerprint"], reused=False)

    monkeypatch.setattr(job_module, "_extract", plan_only)
    variants = [SETTINGS, GridSettings("resnet18", "random", 96, 2),
                GridSettings("resnet18", "random", 64, 3),
                GridSettings("resnet34", "random", 64, 2),
                GridSettings("resnet18", "random", 64, 2, dtype="float16"),
                GridSettings("resnet18", "random", 64, 2, layer="layer3")]
    fingerprints = [extract(shapes, tmp_path, s).fingerprint for s in variants]
    assert len(set(fingerprints)) == len(variants)
    assert extract(shapes, tmp_path, SETTINGS).fingerprint == fingerprints[0]
    image = shapes[0] / "images" / "shapes_000003.png"
    data = image.read_bytes()
    try:
        image.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        assert extract(shapes, tmp_path, SETTINGS).fingerprint != fingerprints[0]
    finally:
        image.write_bytes(data)


def test_bad_files_are_skipped_recorded_and_extraction_goes_on(shapes, tmp_path):
    image_root, dataset_json = shapes
    data = json.loads(dataset_json.read_text())
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "empty.png").write_bytes(b"")
    (broken / "text.png").write_text("not an image")
    (broken / "cut.png").write_bytes((image_root / "images/shapes_000000.png").read_bytes()[:200])
    for k, name in enumerate(["empty.png", "text.png", "cut.png", "absent.png"]):
        data["images"][k]["filepath"] = str(broken)
        data["images"][k]["filename"] = name
    bad_json = tmp_path / "dataset_bad.json"
    bad_json.write_text(json.dumps(data))
    result = extract_grid(bad_json, image_root, SETTINGS, root=tmp_path / "f", batch_size=4,
                          workers=0, progress=False, images_outside_root=True)
    assert result.extracted == 10 and result.skipped == 4
    store = open_store(result.store)
    assert set(store.meta["skipped"]) == {"0", "1", "2", "3"}
    assert "missing" in store.meta["skipped"]["3"]
    assert len(store) == 10 and 4 in store


def test_missing_weights_say_where_to_put_them(shapes, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(CapstackError, match=r"no weights for resnet18: put torchvision's "
                                            r"ImageNet state_dict at .*resnet18-f37072fd.pth"):
        extract(shapes, tmp_path, GridSettings("resnet18", None, 64, 2))
    with pytest.raises(CapstackError, match="nope.pth: backbone weights not found"):
        extract(shapes, tmp_path, GridSettings("resnet18", str(tmp_path / "nope.pth"), 64, 2))


def test_random_resnet101_stores_float32_and_float16_says_it_overflows(shapes, tmp_path):
    """A random ResNet-101's layer4 passes float16's 65504 at 224 px: random weights get a
    float32 store unless --dtype says otherwise, and float16 is refused, saying why."""
    settings = GridSettings("resnet101", "random", 224, 2)
    with pytest.raises(CapstackError, match=r"image 0: non-finite feature values \(largest "
                                            r"magnitude .* overflows float16\).*--dtype float32"):
        extract(shapes, tmp_path / "half", replace(settings, dtype="float16"))
    result = extract(shapes, tmp_path / "default", settings)
    store = open_store(result.store)
    assert store.meta["fields"]["features"]["dtype"] == "float32"
    features = store.read_batch(store.ids()).features
    assert np.isfinite(features).all() and np.abs(features).max() > 65504


def test_weights_from_a_file_keep_float16_and_a_given_dtype_holds(shapes, tmp_path):
    import torch

    from pipeline.vision.backbones import build_resnet

    torch.manual_seed(0)
    torch.save(build_resnet("resnet18").state_dict(), tmp_path / "resnet18.pth")
    trained = replace(SETTINGS, weights=str(tmp_path / "resnet18.pth"))
    assert open_store(extract(shapes, tmp_path / "a", trained).store).meta["fields"] == \
        {"features": {"shape": ["N", 512], "dtype": "float16"}}
    given = replace(SETTINGS, dtype="float16")
    assert open_store(extract(shapes, tmp_path / "b", given).store).meta["fields"] == \
        {"features": {"shape": ["N", 512], "dtype": "float16"}}


def _extract_cmd(shapes, root, out_log):
    image_root, dataset = shapes
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "extract-grid", str(dataset), str(image_root),
         "--backbone", "resnet18", "--weights", "random", "--image-size", "64", "--grid", "2",
         "--batch", "1", "--workers", "0", "--features-root", str(root)],
        stdout=out_log, stderr=subprocess.STDOUT, start_new_session=True)


def _partial_store(root: Path):
    found = list(root.glob("*.partial")) if root.exists() else []
    return found[0] if found else None


@pytest.fixture(scope="module")
def many_shapes(tmp_path_factory):
    """Enough images that a kill after 3 batches always lands before the end, however fast."""
    root = tmp_path_factory.mktemp("many") / "shapes"
    write_shapes_dataset(root, n_train=60, n_val=2, n_test=2, seed=1, size=64)
    return root, root / "dataset_shapes.json"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_or_interrupted_extraction_resumes_to_the_same_records(many_shapes, tmp_path, sig):
    shapes = many_shapes
    # batch 1 as in the killed run, so that even the rounding is the same
    reference = extract(shapes, tmp_path / "reference", batch_size=1).store
    root = tmp_path / "features"
    with open(tmp_path / "log.txt", "w") as log:
        proc = _extract_cmd(shapes, root, log)
        partial = wait_for(lambda: _partial_store(root))
        wait_for(lambda: committed_records(partial) >= 3)
        os.killpg(proc.pid, sig) if sig == signal.SIGKILL else proc.send_signal(sig)
        assert proc.wait(60) != 0
    done_before = committed_records(partial)
    assert 3 <= done_before < 64
    if sig == signal.SIGINT:
        assert "interrupted" in (tmp_path / "log.txt").read_text()
    assert not (root / partial.name.replace(".partial", "")).exists()
    with open(tmp_path / "log2.txt", "w") as log:
        assert _extract_cmd(shapes, root, log).wait(120) == 0
    resumed = open_store(root / partial.name[:-len(".partial")])
    expected = open_store(reference)
    assert sorted(resumed.ids()) == sorted(expected.ids()) and len(resumed) == 64
    for i in expected.ids():
        np.testing.assert_array_equal(resumed.get(i).features, expected.get(i).features)
