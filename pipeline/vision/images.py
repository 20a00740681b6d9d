"""Decoding images for feature extraction, detector training and the demo, robust to bad files.

Extractors read the images named in a Karpathy json from ``IMAGE_ROOT/relpath``
inside DataLoader workers (so do ``train-detector`` and ``train-backbone``). A bad
file never stops an extraction: :func:`load_rgb` raises :class:`ImageSkipped` with
a short reason, :class:`ImageDataset` turns that into an item with ``"skipped":
reason`` and :func:`collate_images` collects the ``(image_id, reason)`` pairs of a
batch next to the images that loaded.

How :func:`load_rgb` makes RGB of each PIL mode (after a full decode and after the
EXIF orientation is applied with ``ImageOps.exif_transpose``):

- ``RGB``, ``L``, ``1``, ``P``, ``CMYK``, ``YCbCr``, ...: ``Image.convert("RGB")``. ``1``
  gives 0/255, ``L`` is copied into the three channels. CMYK JPEGs, Adobe-inverted ones
  included, are already un-inverted by PIL's decoder, so the plain conversion is right.
- with alpha (``RGBA``, ``LA``, ``PA``, ``RGBa``, ``La``) or a ``transparency`` key
  (``P``/``L``/``RGB`` with tRNS): composited onto white, not black (alpha-weighted mean of
  the colour and white); fully opaque images are converted as they are.
- ``I;16`` (any byte order): 16-bit, ``round(v / 257)``: 65535 -> 255, 32768 -> 128.
  PIL's own ``convert`` would clip everything above 255 to white.
- ``I`` (32-bit int): from a PNG it is 16-bit, as above; otherwise by its values: all in
  0..255 -> as they are, all in 0..65535 -> as 16-bit, else stretched min..max.
- ``F`` (float): values in 0..1 -> ``* 255``; in 0..255 -> as they are; else stretched
  min..max; NaN and infinities -> 0.

A 16-bit tRNS transparent value becomes white as well.
"""

from __future__ import annotations

import operator
import os
import stat
import sys
import warnings
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps, UnidentifiedImageError
from torch.utils.data import Dataset

MAX_PIXELS = 89_478_485  # PIL's own decompression-bomb limit (Image.MAX_IMAGE_PIXELS)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_ORIENTATION = 0x0112  # EXIF tag
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_MAX_REASON = 160


class ImageSkipped(Exception):
    """An image that cannot be used; ``reason`` says why in a few words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# decoding


def load_rgb(path: str | os.PathLike, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """RGB image with EXIF orientation applied; raises :class:`ImageSkipped` with the reason.

    The size is checked from the header before any pixel is decoded: an image of more
    than ``max_pixels`` pixels is skipped as too large. PIL's own decompression-bomb
    check (``Image.MAX_IMAGE_PIXELS``) still applies too; its warning is silenced and its
    error becomes a skip. The file is closed before this returns or raises.
    """
    path = os.fspath(path)
    _check_file(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image: Image.Image = Image.open(path)
        except FileNotFoundError:
            raise ImageSkipped("missing file") from None
        except UnidentifiedImageError:
            raise ImageSkipped("not an image (cannot identify image file)") from None
        except Image.DecompressionBombError as e:
            raise ImageSkipped(_too_large_from_pil(e)) from None
        except PermissionError:
            raise ImageSkipped("unreadable (permission denied)") from None
        except Exception as e:  # a plugin that recognised the file but choked on its header
            raise ImageSkipped(f"truncated or corrupt ({_describe(e)})") from None
        with image:
            width, height = image.size
            if width * height > max_pixels:
                raise ImageSkipped(f"too large to decode safely "
                                   f"({width}x{height} > {max_pixels} pixels)")
            if width <= 0 or height <= 0:
                raise ImageSkipped(f"empty image ({width}x{height})")
            try:
                image.load()
            except Image.DecompressionBombError as e:
                raise ImageSkipped(_too_large_from_pil(e)) from None
            except MemoryError:
                raise ImageSkipped(f"out of memory decoding {width}x{height} pixels") from None
            except Exception as e:  # OSError (truncated), SyntaxError (broken PNG), zlib, ...
                raise ImageSkipped(f"truncated or corrupt ({_describe(e)})") from None
            try:
                image = _exif_transposed(image)
                rgb = to_rgb(image)
            except MemoryError:
                raise ImageSkipped(f"out of memory converting {width}x{height} pixels") from None
            except Exception as e:
                raise ImageSkipped(f"cannot convert mode {image.mode} to RGB "
                                   f"({_describe(e)})") from None
    return rgb


def _check_file(path: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ImageSkipped("missing file") from None
    except NotADirectoryError:
        raise ImageSkipped("missing file (a parent is not a folder)") from None
    except OSError as e:
        raise ImageSkipped(f"unreadable ({e.strerror or _describe(e)})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ImageSkipped("not a file (a folder)")
    if not stat.S_ISREG(st.st_mode):
        raise ImageSkipped("not a regular file")
    if st.st_size == 0:
        raise ImageSkipped("empty file")


def _too_large_from_pil(e: Exception) -> str:
    return f"too large to decode safely ({_describe(e)})"


def _describe(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if len(text) > _MAX_REASON:
        text = text[:_MAX_REASON - 3] + "..."
    return text


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation (2..8) of an opened image, read from its header; 1 when it has
    none, an unknown one, or unreadable EXIF (the pixels are fine: kept as stored)."""
    try:
        orientation = image.getexif().get(_ORIENTATION, 1)
    except Exception:  # malformed EXIF
        return 1
    return orientation if orientation in (2, 3, 4, 5, 6, 7, 8) else 1


def _exif_transposed(image: Image.Image) -> Image.Image:
    """``ImageOps.exif_transpose`` when the orientation needs it; unreadable EXIF is ignored."""
    if exif_orientation(image) == 1:
        return image
    return ImageOps.exif_transpose(image)


def to_rgb(image: Image.Image) -> Image.Image:
    """A new RGB image of a decoded ``image`` of any mode (see the module docstring)."""
    mode = image.mode
    if mode.startswith("I;16"):
        return _gray_to_rgb(_scale_16bit(np.asarray(image)), image)
    if mode == "I":
        return _gray_to_rgb(_scale_int(np.asarray(image), image.format == "PNG"), image)
    if mode == "F":
        return _gray_to_rgb(_scale_float(np.asarray(image)), image)
    if mode == "La":
        image = image.convert("LA")
        mode = "LA"
    if mode in _ALPHA_MODES or "transparency" in image.info:
        return _on_white(image.convert("RGBA"))
    return image.convert("RGB")


def _on_white(rgba: Image.Image) -> Image.Image:
    low, _ = rgba.getchannel("A").getextrema()
    if low == 255:
        return rgba.convert("RGB")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def _gray_to_rgb(gray: np.ndarray, source: Image.Image) -> Image.Image:
    """RGB from an 8-bit gray array; a tRNS ``transparency`` value of ``source`` becomes white."""
    rgb = Image.fromarray(gray).convert("RGB")
    key = source.info.get("transparency")
    if isinstance(key, int) and not isinstance(key, bool):
        mask = Image.fromarray((np.asarray(source) == key).astype(np.uint8) * 255)
        if mask.getextrema()[1]:
            rgb.paste((255, 255, 255), mask=mask)
    return rgb


def _to_uint8(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))


def _scale_16bit(values: np.ndarray) -> np.ndarray:
    return _to_uint8(values.astype(np.float32) / 257.0)


def _stretch(values: np.ndarray) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return _to_uint8(np.zeros(values.shape, np.float32))
    return _to_uint8((values.astype(np.float64) - low) * 255.0 / (high - low))


def _scale_int(values: np.ndarray, sixteen_bit: bool) -> np.ndarray:
    low, high = int(values.min()), int(values.max())
    if sixteen_bit or (low >= 0 and high <= 65535 and high > 255):
        return _scale_16bit(np.clip(values, 0, 65535))
    if low >= 0 and high <= 255:
        return values.astype(np.uint8)
    return _stretch(values)


def _scale_float(values: np.ndarray) -> np.ndarray:
    values = np.nan_to_num(values.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = float(values.min()), float(values.max())
    if low >= 0.0 and high <= 1.0:
        return _to_uint8(values * 255.0)
    if low >= 0.0 and high <= 255.0:
        return _to_uint8(values)
    return _stretch(values)


# ---------------------------------------------------------------------------------------------
# dataset and batches


def karpathy_items(images: Iterable, image_root: str | Path) -> list[tuple[int, Path]]:
    """``(image_id, image_root / relpath)`` for
    :class:`pipeline.captions.karpathy.KarpathyImage` s."""
    root = Path(image_root)
    return [(im.image_id, root / im.relpath) for im in images]


class ImageDataset(Dataset):
    """Items ``(image_id, path)`` -> dicts; never raises for a bad image.

    Each item is ``{"image_id", "image", "height", "width", "skipped"}``: ``image`` is
    ``transform(load_rgb(path))`` or None, ``height``/``width`` the size after the EXIF
    orientation (0 when skipped) and ``skipped`` None or the reason. Picklable when
    ``transform`` is (the ones below are), so it works with any number of workers
    under "fork" and "spawn". An exception raised by ``transform`` itself is a bug and
    is not swallowed (a note names the image), except :class:`ImageSkipped`, its refusal.
    """

    def __init__(self, items: Sequence[tuple[int, str | Path]],
                 transform: Callable[[Image.Image], torch.Tensor],
                 max_pixels: int = MAX_PIXELS):
        self.items = [(operator.index(image_id), os.fspath(path)) for image_id, path in items]
        self.transform = transform
        self.max_pixels = int(max_pixels)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        image_id, path = self.items[i]
        try:
            image = load_rgb(path, self.max_pixels)
        except ImageSkipped as e:
            return {"image_id": image_id, "image": None, "height": 0, "width": 0,
                    "skipped": e.reason}
        width, height = image.size
        try:
            tensor = self.transform(image)
        except ImageSkipped as e:  # a transform may refuse an image (too thin for a detector)
            return {"image_id": image_id, "image": None, "height": 0, "width": 0,
                    "skipped": e.reason}
        except Exception as e:
            if sys.version_info >= (3, 11):  # add_note is 3.11's; 3.10 raises e as it is
                e.add_note(f"while transforming image {image_id} ({path})")
            raise
        return {"image_id": image_id, "image": tensor, "height": height, "width": width,
                "skipped": None}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self.items)} images, transform={self.transform!r}, "
                f"max_pixels={self.max_pixels})")


def collate_images(batch: list[dict]) -> dict:
    """Items of :class:`ImageDataset` -> one batch; images stay a list (sizes may differ).

    ``{"image_ids", "images", "heights", "widths"}`` hold the loaded images in batch
    order; ``"skipped"`` is a list of ``(image_id, reason)``.
    """
    out: dict = {"image_ids": [], "images": [], "heights": [], "widths": [], "skipped": []}
    for item in batch:
        if item["skipped"] is not None:
            out["skipped"].append((item["image_id"], item["skipped"]))
            continue
        out["image_ids"].append(item["image_id"])
        out["images"].append(item["image"])
        out["heights"].append(item["height"])
        out["widths"].append(item["width"])
    return out


def stack_images(images: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(images)``; a ValueError naming the shapes when they differ."""
    if not images:
        raise ValueError("stack_images: no images to stack (every image of the batch was skipped?)")
    shapes = {tuple(t.shape) for t in images}
    if len(shapes) > 1:
        listed = ", ".join(str(list(s)) for s in sorted(shapes))
        raise ValueError(f"stack_images: images of different shapes cannot be stacked "
                         f"({listed}); use a resizing transform such as grid_transform")
    return torch.stack(images)


# ---------------------------------------------------------------------------------------------
# transforms (picklable classes: DataLoader workers may be spawned). Plain torch, the same
# arithmetic as torchvision.transforms.v2 (PILToTensor, Resize(bilinear, antialias=True),
# ToDtype(scale=True), Normalize), so that a spawned worker need not import torchvision.


def pil_to_uint8(image: Image.Image) -> torch.Tensor:
    """uint8 [3, H, W] of an RGB PIL image (a copy: PIL's buffer stays untouched)."""
    if image.mode != "RGB":
        raise ValueError(f"expected an RGB image, got mode {image.mode} (use load_rgb)")
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()


class GridTransform:
    """RGB PIL image -> float32 [3, size, size]: bilinear antialiased resize, ImageNet norm."""

    def __init__(self, image_size: int, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD):
        size = operator.index(image_size)
        if size <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.image_size = size
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.normalise(self.resize(pil_to_uint8(image)), *self.stats(torch.device("cpu")))

    def resize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 [3, H, W] -> [3, size, size] of whole values 0..255: uint8 on the CPU (resized
        as uint8, like torchvision on a PIL image); float32 on another device, rounded, as
        torchvision resizes uint8 there (the uint8 kernels are the CPU's)."""
        size = (self.image_size, self.image_size)
        if x.device.type == "cpu":
            return F.interpolate(x[None], size=size, mode="bilinear", align_corners=False,
                                 antialias=True)[0]
        x = F.interpolate(x[None].to(torch.float32), size=size, mode="bilinear",
                          align_corners=False, antialias=True)[0]
        return x.round_().clamp_(0, 255)

    def stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std), each float32 [3, 1, 1] on ``device``."""
        mean = torch.tensor(self.mean, dtype=torch.float32).view(3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(3, 1, 1)
        return mean.to(device), std.to(device)

    @staticmethod
    def normalise(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Resized values 0..255 -> float32 in 0..1, then ``(x - mean) / std``."""
        return x.to(torch.float32).div_(255.0).sub_(mean).div_(std)

    def __repr__(self) -> str:
        return f"GridTransform(image_size={self.image_size})"


MIN_DETECTOR_SIDE = 16  # pixels of the resized image's shorter side a detector needs


class DetectorTransform:
    """RGB PIL image -> float32 [3, H, W] in 0..1, original size (detectors resize themselves).

    With the detector's ``min_size``/``max_size``, an image whose shorter side would
    shrink below :data:`MIN_DETECTOR_SIDE` pixels at the detector's scale (a 1x10000
    strip: its longer side is brought to ``max_size``) is skipped with that reason:
    resized to 0 rows it would stop the whole extraction, at every rerun.
    """

    def __init__(self, min_size: int = 0, max_size: int = 0):
        self.min_size, self.max_size = int(min_size), int(max_size)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        if self.max_size:
            self.check_side(*image.size)
        return pil_to_uint8(image).to(torch.float32).div_(255.0)

    def check_side(self, width: int, height: int) -> None:
        short, long = min(width, height), max(width, height)
        scale = min(self.min_size / short, self.max_size / long)
        if round(short * scale) < MIN_DETECTOR_SIDE:
            raise ImageSkipped(
                f"too thin for the detector: {width}x{height} would be "
                f"{round(width * scale)}x{round(height * scale)} pixels at its scale (shorter "
                f"side {self.min_size}, longer at most {self.max_size}; at least "
                f"{MIN_DETECTOR_SIDE} needed)")

    def __repr__(self) -> str:
        return f"DetectorTransform(min_size={self.min_size}, max_size={self.max_size})"


def grid_transform(image_size: int) -> GridTransform:
    """Resize to ``image_size`` x ``image_size``, float [3, H, W], ImageNet mean/std."""
    return GridTransform(image_size)


def detector_transform(min_size: int = 0, max_size: int = 0) -> DetectorTransform:
    """Float [3, H, W] in 0..1, no resize; images too thin for the detector's sizes skipped."""
    return DetectorTransform(min_size, max_size)
