"""pipeline.vision.images: decoding every PIL mode to RGB, skipping bad files, DataLoader use."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from pipeline.captions.karpathy import load_karpathy
from pipeline.vision.images import (IMAGENET_MEAN, IMAGENET_STD, MAX_PIXELS, ImageDataset,
                                    ImageSkipped, collate_images, detector_transform,
                                    grid_transform, karpathy_items, load_rgb, stack_images)


def pixels(image: Image.Image) -> np.ndarray:
    """[H, W, 3] int array of an RGB image."""
    assert image.mode == "RGB"
    return np.asarray(image).astype(int)


def close(actual, expected, tol: int) -> bool:
    return bool(np.all(np.abs(np.asarray(actual, int) - np.asarray(expected, int)) <= tol))


def noise_rgb(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def skip_reason(path, **kw) -> str:
    with pytest.raises(ImageSkipped) as info:
        load_rgb(path, **kw)
    assert str(info.value) == info.value.reason
    return info.value.reason


# --- modes -> RGB ------------------------------------------------------------------------------


def test_rgb_png_round_trips_exactly(tmp_path):
    image = noise_rgb(13, 7)
    image.save(tmp_path / "a.png")
    out = load_rgb(tmp_path / "a.png")
    assert out.size == (13, 7)
    assert np.array_equal(np.asarray(out), np.asarray(image))


def test_grayscale_l(tmp_path):
    gray = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (3, 1))  # 16 x 3
    Image.fromarray(gray).save(tmp_path / "l.png")
    out = pixels(load_rgb(tmp_path / "l.png"))
    assert out.shape == (3, 16, 3)
    for c in range(3):
        assert np.array_equal(out[..., c], gray)


def test_one_bit(tmp_path):
    image = Image.new("1", (6, 4), 0)
    image.putpixel((1, 1), 1)
    image.putpixel((5, 3), 1)
    image.save(tmp_path / "b.png")
    out = pixels(load_rgb(tmp_path / "b.png"))
    assert out.shape == (4, 6, 3)
    assert set(np.unique(out)) == {0, 255}
    assert out[1, 1].tolist() == [255, 255, 255] and out[3, 5].tolist() == [255, 255, 255]
    assert out[0, 0].tolist() == [0, 0, 0]


def test_palette_with_transparency_goes_on_white(tmp_path):
    image = Image.new("P", (8, 4), 0)
    image.putpalette([0, 0, 0, 255, 0, 0, 0, 0, 255] + [0] * (253 * 3))
    for x in range(4):
        for y in range(4):
            image.putpixel((x, y), 1)  # left half red, right half index 0 (transparent black)
    image.putpixel((7, 0), 2)
    image.save(tmp_path / "p.png", transparency=0)
    assert Image.open(tmp_path / "p.png").mode == "P"
    out = pixels(load_rgb(tmp_path / "p.png"))
    assert out[2, 1].tolist() == [255, 0, 0]
    assert out[2, 6].tolist() == [255, 255, 255]  # transparent -> white, not black
    assert out[0, 7].tolist() == [0, 0, 255]


def test_palette_without_transparency(tmp_path):
    image = Image.new("P", (2, 1), 0)
    image.putpalette([10, 20, 30, 200, 100, 50] + [0] * (254 * 3))
    image.putpixel((1, 0), 1)
    image.save(tmp_path / "p.gif")
    out = pixels(load_rgb(tmp_path / "p.gif"))
    assert out[0].tolist() == [[10, 20, 30], [200, 100, 50]]


def test_rgba_composited_on_white(tmp_path):
    rgba = np.zeros((4, 6, 4), np.uint8)
    rgba[:, :3] = (255, 0, 0, 255)    # opaque red
    rgba[:, 3:5] = (0, 0, 0, 0)       # fully transparent black
    rgba[:, 5] = (0, 0, 255, 128)     # half-transparent blue
    Image.fromarray(rgba).save(tmp_path / "a.png")
    out = pixels(load_rgb(tmp_path / "a.png"))
    assert out.shape == (4, 6, 3)
    assert out[1, 1].tolist() == [255, 0, 0]
    assert out[1, 3].tolist() == [255, 255, 255]
    assert close(out[1, 5], [127, 127, 255], 1)


def test_opaque_rgba_is_unchanged(tmp_path):
    rgb = noise_rgb(5, 5)
    rgba = rgb.copy()
    rgba.putalpha(255)
    rgba.save(tmp_path / "o.png")
    assert np.array_equal(np.asarray(load_rgb(tmp_path / "o.png")), np.asarray(rgb))


def test_la_composited_on_white(tmp_path):
    la = np.zeros((2, 3, 2), np.uint8)
    la[:, 0] = (100, 255)
    la[:, 1] = (0, 0)
    la[:, 2] = (0, 51)  # 20% black over white -> 204
    Image.fromarray(la, mode="LA").save(tmp_path / "la.png")
    out = pixels(load_rgb(tmp_path / "la.png"))
    assert out[0, 0].tolist() == [100, 100, 100]
    assert out[0, 1].tolist() == [255, 255, 255]
    assert close(out[0, 2], [204, 204, 204], 1)


def test_trns_transparent_colour_goes_on_white(tmp_path):
    """PNG tRNS: one colour (or gray / 16-bit gray value) marked transparent."""
    Image.new("RGB", (2, 1), (1, 2, 3)).save(tmp_path / "rgb.png", transparency=(1, 2, 3))
    assert pixels(load_rgb(tmp_path / "rgb.png"))[0].tolist() == [[255, 255, 255]] * 2
    Image.fromarray(np.array([[0, 50, 200]], np.uint8)).save(tmp_path / "l.png", transparency=50)
    assert pixels(load_rgb(tmp_path / "l.png"))[0, :, 0].tolist() == [0, 255, 200]
    Image.fromarray(np.array([[0, 1000, 32768]], np.uint16)).save(tmp_path / "g16.png",
                                                                  transparency=1000)
    assert pixels(load_rgb(tmp_path / "g16.png"))[0, :, 0].tolist() == [0, 255, 128]


def test_cmyk_jpeg_adobe_inverted(tmp_path):
    cmyk = Image.new("CMYK", (32, 16), (0, 0, 0, 0))          # no ink: white
    cmyk.paste((0, 255, 255, 0), (0, 0, 16, 16))              # magenta + yellow: red
    cmyk.save(tmp_path / "c.jpg", quality=95)
    with Image.open(tmp_path / "c.jpg") as raw:
        assert raw.mode == "CMYK"
        assert "adobe" in raw.info  # PIL writes Photoshop-style inverted CMYK with an APP14 marker
    out = pixels(load_rgb(tmp_path / "c.jpg"))
    assert out.shape == (16, 32, 3)
    assert close(out[8, 4], [255, 0, 0], 6)
    assert close(out[8, 28], [255, 255, 255], 6)


def test_16bit_grayscale_png_is_scaled_not_clipped(tmp_path):
    values = np.array([[0, 32768, 65535, 25700, 257]], np.uint16)
    Image.fromarray(values).save(tmp_path / "g16.png")
    with Image.open(tmp_path / "g16.png") as raw:
        assert raw.mode in ("I;16", "I")
    out = pixels(load_rgb(tmp_path / "g16.png"))
    assert out.shape == (1, 5, 3)
    assert out[0, :, 0].tolist() == [0, 128, 255, 100, 1]
    assert np.array_equal(out[..., 0], out[..., 2])


def test_32bit_int_tiff(tmp_path):
    def load_i(values):
        image = Image.new("I", (len(values), 1))
        image.putdata(values)
        image.save(tmp_path / "i.tif")
        return pixels(load_rgb(tmp_path / "i.tif"))[0, :, 0].tolist()

    assert load_i([0, 100, 255]) == [0, 100, 255]             # 8-bit range: as is
    assert load_i([0, 32768, 65535]) == [0, 128, 255]         # 16-bit range: / 257
    assert load_i([-100, 0, 100]) == [0, 128, 255]            # anything else: stretched


def test_float_tiff(tmp_path):
    def load_f(values):
        Image.fromarray(np.array([values], np.float32)).save(tmp_path / "f.tif")
        with Image.open(tmp_path / "f.tif") as raw:
            assert raw.mode == "F"
        return pixels(load_rgb(tmp_path / "f.tif"))[0, :, 0].tolist()

    assert load_f([0.0, 0.5, 1.0, 0.2]) == [0, 128, 255, 51]    # 0..1
    assert load_f([0.0, 100.0, 255.0]) == [0, 100, 255]          # 0..255
    assert load_f([-1000.0, 0.0, 1000.0]) == [0, 128, 255]       # stretched
    assert load_f([float("nan"), 1.0]) == [0, 255]


@pytest.mark.parametrize("orientation, corner", [(6, "top-right"), (8, "bottom-left"),
                                                 (3, "bottom-right"), (1, "top-left")])
def test_exif_orientation(tmp_path, orientation, corner):
    stored = Image.new("RGB", (64, 32), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 16, 16))  # marked stored top-left corner
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(tmp_path / "e.jpg", exif=exif, quality=95)
    out = load_rgb(tmp_path / "e.jpg")
    width, height = out.size
    assert (width, height) == ((32, 64) if orientation in (6, 8) else (64, 32))
    at = {"top-left": (8, 8), "top-right": (width - 8, 8), "bottom-left": (8, height - 8),
          "bottom-right": (width - 8, height - 8)}
    arr = pixels(out)
    for name, (x, y) in at.items():
        expected = [255, 0, 0] if name == corner else [0, 0, 255]
        assert close(arr[y, x], expected, 8), (name, arr[y, x])


def test_malformed_exif_is_ignored(tmp_path):
    noise_rgb(8, 4).save(tmp_path / "e.jpg", exif=b"Exif\x00\x00garbage-not-tiff")
    assert load_rgb(tmp_path / "e.jpg").size == (8, 4)


def test_result_is_detached_from_the_file(tmp_path):
    noise_rgb(8, 8).save(tmp_path / "a.jpg")
    out = load_rgb(tmp_path / "a.jpg")
    os.remove(tmp_path / "a.jpg")
    assert pixels(out).shape == (8, 8, 3)


# --- bad files are skipped with a reason -------------------------------------------------------


@pytest.fixture
def real_jpeg(tmp_path) -> Path:
    path = tmp_path / "real.jpg"
    noise_rgb(64, 48).save(path, quality=90)
    return path


def test_skip_missing_file(tmp_path):
    assert skip_reason(tmp_path / "nope.jpg") == "missing file"
    assert skip_reason(tmp_path / "no-folder" / "nope.jpg") == "missing file"


def test_skip_empty_file(tmp_path):
    (tmp_path / "e.jpg").write_bytes(b"")
    assert skip_reason(tmp_path / "e.jpg") == "empty file"


def test_skip_folder(tmp_path):
    (tmp_path / "d.jpg").mkdir()
    assert skip_reason(tmp_path / "d.jpg").startswith("not a file")


def test_skip_text_named_jpg(tmp_path):
    (tmp_path / "t.jpg").write_text("this is not an image\n")
    assert skip_reason(tmp_path / "t.jpg") == "not an image (cannot identify image file)"


def test_skip_truncated_jpeg(tmp_path, real_jpeg):
    data = real_jpeg.read_bytes()
    (tmp_path / "half.jpg").write_bytes(data[: len(data) // 2])
    reason = skip_reason(tmp_path / "half.jpg")
    assert reason.startswith("truncated or corrupt (")
    assert "truncated" in reason[len("truncated or corrupt"):]


def test_skip_corrupt_png(tmp_path):
    noise_rgb(64, 64).save(tmp_path / "ok.png")
    data = bytearray((tmp_path / "ok.png").read_bytes())
    middle = len(data) // 2
    for k in range(middle, middle + 32):
        data[k] ^= 0xFF
    (tmp_path / "bad.png").write_bytes(bytes(data))
    assert skip_reason(tmp_path / "bad.png").startswith("truncated or corrupt (")


def test_skip_too_large(tmp_path):
    noise_rgb(100, 80).save(tmp_path / "big.png")
    assert (skip_reason(tmp_path / "big.png", max_pixels=5000)
            == "too large to decode safely (100x80 > 5000 pixels)")
    assert load_rgb(tmp_path / "big.png", max_pixels=8000).size == (100, 80)
    assert MAX_PIXELS == Image.MAX_IMAGE_PIXELS == 89_478_485


def test_size_is_checked_before_decoding(tmp_path):
    """A header declaring too many pixels is refused without reading the pixel data."""
    noise_rgb(100, 80).save(tmp_path / "big.png")
    data = (tmp_path / "big.png").read_bytes()
    (tmp_path / "header_only.png").write_bytes(data[:200])  # header intact, pixels cut off
    assert skip_reason(tmp_path / "header_only.png").startswith("truncated or corrupt")
    assert skip_reason(tmp_path / "header_only.png", max_pixels=5000).startswith("too large")


def test_pil_decompression_bomb_error_becomes_a_skip(tmp_path, monkeypatch):
    noise_rgb(100, 100).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10000 > 2 * 1000: PIL raises
    reason = skip_reason(tmp_path / "big.png", max_pixels=10**9)
    assert reason.startswith("too large to decode safely (")


def test_pil_decompression_bomb_warning_does_not_escape(tmp_path, monkeypatch):
    noise_rgb(100, 100).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 6000)  # 6000 < 10000 < 12000: PIL warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_rgb(tmp_path / "big.png", max_pixels=10**9).size == (100, 100)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_no_file_handles_left_open(tmp_path, real_jpeg):
    data = real_jpeg.read_bytes()
    (tmp_path / "half.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "t.jpg").write_text("text")
    noise_rgb(100, 80).save(tmp_path / "big.png")
    Image.new("I;16", (4, 4)).save(tmp_path / "g16.png")

    def run_all():
        load_rgb(real_jpeg)
        load_rgb(tmp_path / "g16.png")
        for bad, kw in [("half.jpg", {}), ("t.jpg", {}), ("big.png", {"max_pixels": 10})]:
            with pytest.raises(ImageSkipped):
                load_rgb(tmp_path / bad, **kw)

    run_all()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        run_all()
    assert len(os.listdir("/proc/self/fd")) == before


def test_image_skipped_pickles():
    error = pickle.loads(pickle.dumps(ImageSkipped("empty file")))
    assert isinstance(error, ImageSkipped) and error.reason == "empty file"


# --- dataset, DataLoader, collate --------------------------------------------------------------


@pytest.fixture
def mixed_items(tmp_path) -> list[tuple[int, Path]]:
    """Good images of different sizes and modes, interleaved with bad files."""
    noise_rgb(40, 30, seed=1).save(tmp_path / "a.jpg")
    Image.fromarray(np.arange(24 * 20, dtype=np.uint8).reshape(20, 24)).save(tmp_path / "b.png")
    (tmp_path / "empty.jpg").write_bytes(b"")
    rgba = Image.new("RGBA", (16, 16), (0, 255, 0, 0))
    rgba.save(tmp_path / "c.png")
    (tmp_path / "text.jpg").write_text("hello")
    exif = Image.Exif()
    exif[0x0112] = 6
    noise_rgb(50, 20, seed=2).save(tmp_path / "d.jpg", exif=exif)
    return [(10, tmp_path / "a.jpg"), (11, str(tmp_path / "b.png")), (12, tmp_path / "empty.jpg"),
            (13, tmp_path / "c.png"), (14, tmp_path / "missing.jpg"),
            (15, tmp_path / "text.jpg"), (16, tmp_path / "d.jpg")]


EXPECTED_SKIPS = [(12, "empty file"), (14, "missing file"),
                  (15, "not an image (cannot identify image file)")]


def test_dataset_items(mixed_items):
    ds = ImageDataset(mixed_items, detector_transform())
    assert len(ds) == 7
    a = ds[0]
    assert a["image_id"] == 10 and a["skipped"] is None
    assert (a["height"], a["width"]) == (30, 40) and a["image"].shape == (3, 30, 40)
    d = ds[6]
    assert (d["height"], d["width"]) == (50, 20)  # after EXIF transpose
    assert d["image"].shape == (3, 50, 20)
    c = ds[3]
    assert torch.allclose(c["image"], torch.ones(3, 16, 16))  # transparent green -> white
    assert ds[2] == {"image_id": 12, "image": None, "height": 0, "width": 0,
                     "skipped": "empty file"}


def test_dataset_pickles(mixed_items):
    ds = pickle.loads(pickle.dumps(ImageDataset(mixed_items, grid_transform(32), max_pixels=10**6)))
    assert len(ds) == 7 and ds.max_pixels == 10**6
    assert ds[0]["image"].shape == (3, 32, 32)


def test_dataset_max_pixels(mixed_items):
    ds = ImageDataset(mixed_items, detector_transform(), max_pixels=1000)
    assert ds[0]["skipped"] == "too large to decode safely (40x30 > 1000 pixels)"
    assert ds[3]["skipped"] is None  # 16x16


def test_transform_errors_are_not_swallowed(mixed_items):
    def broken(image):
        raise RuntimeError("bug in transform")

    with pytest.raises(RuntimeError, match="bug in transform") as info:
        ImageDataset(mixed_items[:1], broken)[0]
    assert any("image 10" in note for note in info.value.__notes__)


def test_collate_mixed_batch(mixed_items):
    ds = ImageDataset(mixed_items, detector_transform())
    batch = collate_images([ds[i] for i in range(len(ds))])
    assert batch["image_ids"] == [10, 11, 13, 16]
    assert [tuple(t.shape) for t in batch["images"]] == [(3, 30, 40), (3, 20, 24), (3, 16, 16),
                                                          (3, 50, 20)]
    assert batch["heights"] == [30, 20, 16, 50]
    assert batch["widths"] == [40, 24, 16, 20]
    assert batch["skipped"] == EXPECTED_SKIPS


def test_collate_all_skipped():
    batch = collate_images([{"image_id": 1, "image": None, "height": 0, "width": 0,
                             "skipped": "empty file"}])
    assert batch == {"image_ids": [], "images": [], "heights": [], "widths": [],
                     "skipped": [(1, "empty file")]}


def _load_all(items, transform, workers, context=None):
    loader = DataLoader(ImageDataset(items, transform), batch_size=3, num_workers=workers,
                        collate_fn=collate_images, multiprocessing_context=context)
    ids, images, sizes, skipped = [], [], [], []
    for batch in loader:
        ids += batch["image_ids"]
        images += batch["images"]
        sizes += list(zip(batch["heights"], batch["widths"]))
        skipped += batch["skipped"]
    return ids, images, sizes, skipped


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_dataloader_workers_match_in_process(mixed_items, context):
    if context not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    reference = _load_all(mixed_items, detector_transform(), 0)
    assert reference[0] == [10, 11, 13, 16] and reference[3] == EXPECTED_SKIPS
    ids, images, sizes, skipped = _load_all(mixed_items, detector_transform(), 2, context)
    assert ids == reference[0] and sizes == reference[2] and skipped == reference[3]
    for got, want in zip(images, reference[1], strict=True):
        assert torch.equal(got, want)


def test_dataloader_grid_batches_stack(mixed_items):
    loader = DataLoader(ImageDataset(mixed_items, grid_transform(24)), batch_size=4,
                        collate_fn=collate_images)
    for batch in loader:
        if batch["image_ids"]:
            assert stack_images(batch["images"]).shape == (len(batch["image_ids"]), 3, 24, 24)


def test_karpathy_items(tiny_dataset_json, tmp_path):
    dataset = load_karpathy(tiny_dataset_json)
    items = karpathy_items(dataset.images, tmp_path / "images")
    assert items[0] == (0, tmp_path / "images" / "img_0.jpg")
    assert len(items) == 4
    assert all(r == "missing file" for _, r in collate_images(
        [ImageDataset(items, detector_transform())[i] for i in range(4)])["skipped"])


# --- stacking and transforms -------------------------------------------------------------------


def test_stack_images():
    same = [torch.zeros(3, 4, 5), torch.ones(3, 4, 5)]
    assert stack_images(same).shape == (2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"different shapes.*\[3, 4, 5\].*\[3, 5, 4\]"):
        stack_images([torch.zeros(3, 4, 5), torch.zeros(3, 5, 4)])
    with pytest.raises(ValueError, match="no images"):
        stack_images([])


def test_grid_transform_shape_and_normalisation():
    transform = grid_transform(32)
    out = transform(Image.new("RGB", (100, 60), (255, 128, 0)))
    assert out.dtype == torch.float32 and out.shape == (3, 32, 32)
    assert type(out) is torch.Tensor
    expected = [(v / 255 - m) / s for v, m, s in zip((255, 128, 0), IMAGENET_MEAN, IMAGENET_STD)]
    for c in range(3):
        assert torch.allclose(out[c], torch.full((32, 32), expected[c]), atol=1e-5)
    # a real photo-like image: normalised statistics are sane and pickling keeps behaviour
    image = noise_rgb(70, 50)
    again = pickle.loads(pickle.dumps(transform))
    assert torch.equal(again(image), transform(image))
    assert grid_transform(16)(image).shape == (3, 16, 16)
    with pytest.raises(ValueError):
        grid_transform(0)


def test_grid_transform_antialiases():
    """Downscaling a fine checkerboard gives mid-gray, not aliased black/white."""
    board = (np.indices((64, 64)).sum(axis=0) % 2 * 255).astype(np.uint8)
    image = Image.fromarray(board).convert("RGB")
    out = grid_transform(8)(image)
    gray = [(0.5 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]
    for c in range(3):
        assert torch.allclose(out[c], torch.full((8, 8), gray[c]), atol=0.05)


def test_detector_transform():
    with pytest.raises(ValueError, match="RGB"):
        detector_transform()(Image.new("L", (2, 2)))
    image = noise_rgb(37, 21)
    out = detector_transform()(image)
    assert out.dtype == torch.float32 and out.shape == (3, 21, 37)
    assert type(out) is torch.Tensor
    assert 0.0 <= out.min() and out.max() <= 1.0
    expected = torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.equal(pickle.loads(pickle.dumps(detector_transform()))(image), out)


def test_transforms_match_torchvision_v2():
    """Same numbers as the torchvision.transforms.v2 pipelines they stand in for."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    image = noise_rgb(90, 61, seed=3)
    reference = v2.Compose([v2.PILToTensor(), v2.Resize((40, 40), antialias=True),
                            v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    assert torch.allclose(grid_transform(40)(image), reference(image).as_subclass(torch.Tensor),
                          atol=1e-6)
    reference = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)])
    assert torch.allclose(detector_transform()(image), reference(image).as_subclass(torch.Tensor),
                          atol=1e-6)
