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


SHAPES = dict(n_train=10, n_val=2, n_test=2, seed=1)  # conftest's shapes


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


# --- --decode device: JPEGs read in the workers, decoded on the extraction device ----------------


def _photo(width: int, height: int, seed: int):
    """An RGB image with smooth gradients and sharp edges (chroma subsampling matters)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    image = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width - 10)), int(rng.integers(0, height - 10))
        colour = tuple(int(c) for c in rng.integers(0, 255, 3))
        draw.ellipse([x0, y0, x0 + 20, y0 + 16], fill=colour)
    return image


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """Files of every path --decode device takes: plain RGB and grayscale JPEGs (decoded by
    decode_jpeg), EXIF-rotated ones (oriented on the device), a PNG and a CMYK JPEG (PIL in
    the workers), a truncated JPEG and a missing file (skipped, with PIL's reasons)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("jpegs")
    (root / "images").mkdir()
    names = []

    def add(name, image, **save):
        image.save(root / "images" / name, **save)
        names.append(name)

    for k in range(5):
        add(f"rgb{k}.jpg", _photo(96 - 8 * k, 72, k), quality=90)
    add("gray.jpg", _photo(80, 60, 7).convert("L"), quality=90)
    for orientation in (3, 6, 7):
        exif = Image.Exif()
        exif[0x0112] = orientation
        add(f"turned{orientation}.jpg", _photo(96, 64, orientation), quality=92, exif=exif)
    add("png.png", _photo(70, 50, 8))
    add("cmyk.jpg", _photo(64, 48, 9).convert("CMYK"), quality=95)
    data = (root / "images" / "rgb0.jpg").read_bytes()
    (root / "images" / "cut.jpg").write_bytes(data[: len(data) // 2])
    names += ["cut.jpg", "absent.jpg"]
    images = [{"filepath": "images", "filename": name, "imgid": i, "split": "train",
               "sentences": [{"tokens": ["x"], "sentid": i}]} for i, name in enumerate(names)]
    dataset = root / "dataset_jpegs.json"
    dataset.write_text(json.dumps({"dataset": "jpegs", "images": images}))
    return root, dataset, {name: i for i, name in enumerate(names)}


def _stores(jpegs, tmp_path):
    root, dataset, _ = jpegs
    stores = {}
    for decode in ("cpu", "device"):
        result = extract_grid(dataset, root, replace(SETTINGS, decode=decode),
                              root=tmp_path / decode, batch_size=4, workers=0, progress=False,
                              device="cpu")
        stores[decode] = open_store(result.store)
    return stores


def test_device_decoding_gives_the_pil_paths_features_and_skips(jpegs, tmp_path):
    """On the CPU, decode_jpeg is libjpeg-turbo as PIL's decoder is, and the resize and the
    normalisation are GridTransform's own operations: the pixels, so the features, come out
    equal (measured: byte for byte; the tolerance, 1e-3 on features up to about 5, leaves
    room for float rounding only, not for another decoder's pixels). The PNG and
    the CMYK JPEG go PIL's path; the EXIF-rotated JPEGs are turned as PIL turns them (their
    recorded sizes too); the truncated and the missing files are skipped for PIL's reasons."""
    stores = _stores(jpegs, tmp_path)
    pil, device = stores["cpu"], stores["device"]
    assert sorted(device.ids()) == sorted(pil.ids()) and len(pil) == 11
    for i in pil.ids():
        a, b = pil.get(int(i)), device.get(int(i))
        assert (a.height, a.width) == (b.height, b.width)
        np.testing.assert_allclose(b.features, a.features, rtol=0, atol=1e-3)
    ids = jpegs[2]
    assert (device.get(ids["turned6.jpg"]).height, device.get(ids["turned6.jpg"]).width) == \
        (96, 64)
    assert device.meta["skipped"] == pil.meta["skipped"]
    assert "truncated or corrupt" in device.meta["skipped"][str(ids["cut.jpg"])]
    assert "missing file" in device.meta["skipped"][str(ids["absent.jpg"])]


def test_only_plain_jpegs_reach_the_device(jpegs):
    from pipeline.vision.jpeg import JpegDataset
    from pipeline.vision.images import grid_transform

    root, _, ids = jpegs
    items = [(i, root / "images" / name) for name, i in ids.items()]
    dataset = JpegDataset(items, grid_transform(64))
    undecoded = {name for (name, _), item in zip(ids.items(), dataset) if item["jpeg"] is not None}
    assert undecoded == {"rgb0.jpg", "rgb1.jpg", "rgb2.jpg", "rgb3.jpg", "rgb4.jpg", "gray.jpg",
                         "turned3.jpg", "turned6.jpg", "turned7.jpg"}
    small = JpegDataset(items, grid_transform(64), max_pixels=96 * 64 - 1)
    assert small[ids["turned6.jpg"]]["skipped"].startswith("too large to decode safely")


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_turns_as_pil_does(orientation):
    import torch
    from PIL import Image, ImageOps

    from pipeline.vision.jpeg import oriented

    stored = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = orientation
    image.info["exif"] = exif.tobytes()
    expected = np.asarray(ImageOps.exif_transpose(image))
    turned = oriented(torch.from_numpy(stored).permute(2, 0, 1), orientation)
    np.testing.assert_array_equal(turned.permute(1, 2, 0).numpy(), expected)


def test_a_jpeg_the_decoder_refuses_falls_back_to_pil_or_is_skipped(jpegs):
    """decode_jpeg fails for the whole list when one fails: the others are decoded one by one;
    the refused one is PIL's to load (here it is a fine image) or to skip (the cut one)."""
    import torch

    from pipeline.vision.images import grid_transform, load_rgb
    from pipeline.vision.jpeg import JpegDecoder

    root, _, _ = jpegs
    transform = grid_transform(64)
    decoder = JpegDecoder(transform, torch.device("cpu"))
    good = decoder.dataset([(0, root / "images" / "rgb1.jpg")])[0]
    junk = torch.frombuffer(bytearray(b"\xff\xd8not a jpeg\xff\xd9"), dtype=torch.uint8)
    batch = {"image_ids": [0, 1, 2], "images": [None, None, None], "heights": [72, 50, 72],
             "widths": [88, 70, 96], "skipped": [(9, "missing file")],
             "jpegs": [good["jpeg"], junk, junk], "orientations": [1, 1, 1],
             "paths": [root / "images" / n for n in ("rgb1.jpg", "png.png", "cut.jpg")]}
    out = decoder(batch)
    assert out["image_ids"] == [0, 1] and (out["heights"], out["widths"]) == ([72, 50], [88, 70])
    assert [i for i, _ in out["skipped"]] == [9, 2]
    assert out["skipped"][1][1].startswith("truncated or corrupt")
    for image, name in zip(out["images"], ("rgb1.jpg", "png.png")):
        expected = transform(load_rgb(root / "images" / name))
        torch.testing.assert_close(image, expected, rtol=0, atol=1e-5)


def test_the_decoder_names_the_store_only_when_it_is_not_the_default(jpegs, tmp_path,
                                                                      monkeypatch):
    """The default's settings are those stores had before --decode existed (their names
    stay: tests/test_extractors.py pins the demo's fingerprint); device adds itself."""
    from pipeline.features.extract import job as job_module

    settings = []

    def plan_only(job, items, path, meta, *args):
        settings.append(meta["producer"]["settings"])
        return job_module.JobResult(path, meta["fingerprint"], reused=False)

    monkeypatch.setattr(job_module, "_extract", plan_only)
    root, dataset, _ = jpegs
    planned = [extract_grid(dataset, root, replace(SETTINGS, decode=decode), root=tmp_path,
                            workers=0, progress=False) for decode in ("cpu", "device")]
    cpu, device = settings
    assert "decode" not in cpu and device == {**cpu, "decode": "device"}
    assert planned[0].fingerprint != planned[1].fingerprint
    assert planned[0].store != planned[1].store
    with pytest.raises(CapstackError, match=r"--decode 'gpu': unknown \(choose cpu, device\)"):
        extract_grid(dataset, root, replace(SETTINGS, decode="gpu"), root=tmp_path,
                     workers=0, progress=False)


@pytest.mark.cuda
def test_nvjpeg_pixels_are_within_a_few_levels_of_pils(jpegs, tmp_path):
    """On CUDA, nvJPEG decodes (its IDCT and chroma upsampling are not libjpeg-turbo's) and
    the resize runs in float32, rounded: the model's inputs may differ from the PIL path's
    by a few levels of 255 (at most 8 here, under 1 on average); the images, their sizes
    and the skips are the same."""
    import torch

    from pipeline.vision.images import IMAGENET_STD, ImageDataset, grid_transform
    from pipeline.vision.jpeg import JpegDecoder

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    root, dataset, ids = jpegs
    transform = grid_transform(64)
    decoder = JpegDecoder(transform, torch.device("cuda"))
    items = [(i, root / "images" / name) for name, i in ids.items()]
    batch = decoder(decoder.collate([decoder.dataset(items)[k] for k in range(len(items))]))
    reference = ImageDataset(items, transform)
    assert len(batch["image_ids"]) == 11 and len(batch["skipped"]) == 2
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    for k, i in enumerate(batch["image_ids"]):
        expected = reference[i]
        assert (batch["heights"][k], batch["widths"][k]) == (expected["height"], expected["width"])
        levels = (batch["images"][k].cpu() - expected["image"]).abs().mul(std).mul(255)
        assert levels.max() <= 8 and levels.mean() < 1, (i, levels.max(), levels.mean())
    result = extract_grid(dataset, root, replace(SETTINGS, decode="device"), root=tmp_path,
                          batch_size=4, workers=2, progress=False, device="cuda")
    assert (result.extracted, result.skipped) == (11, 2)
