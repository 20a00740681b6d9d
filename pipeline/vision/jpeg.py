"""JPEG decoding on the extraction device (``extract-grid --decode device``), PIL's path kept.

With ``--decode cpu`` (the default) DataLoader workers decode every image with PIL
(:func:`~pipeline.vision.images.load_rgb`) and resize it. On a GPU that keeps a
ResNet-101 fed only with about as many workers as the machine has cores. With
``--decode device`` a worker only reads a JPEG's bytes (:class:`JpegDataset`), and
the loop's thread decodes the whole batch on the device at once
(``torchvision.io.decode_jpeg`` with a list: nvJPEG on CUDA, libjpeg-turbo on the CPU),
applies the EXIF orientation, resizes and normalises there (:class:`JpegDecoder`).

PIL stays the judge of every file that is not plain: a worker hands over the bytes
only of a regular, non-empty file whose header PIL reads as a JPEG of mode ``RGB`` or
``L``, no larger than ``max_pixels`` and ending with the end-of-image marker (a
truncated file does not). Anything else (a PNG, a CMYK or 16-bit JPEG, a missing or
unreadable file) goes the PIL path in the worker, as with ``--decode cpu``, and is
decoded or skipped with the same reason. A JPEG the device's decoder refuses is
loaded with PIL in the loop's thread the same way.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import NamedTuple, Sequence

import torch
from PIL import Image

from pipeline.vision.images import (MAX_PIXELS, GridTransform, ImageDataset, _check_file,
                                    collate_images, exif_orientation)

DECODES = ("cpu", "device")  # extract-grid --decode: PIL in the workers, or the device
_JPEG_MODES = ("RGB", "L")  # what decode_jpeg(mode=RGB) makes the RGB that PIL's convert makes
_END_OF_IMAGE = b"\xff\xd9"


class EncodedJpeg(NamedTuple):
    data: torch.Tensor  # the file's bytes, uint8 [N]
    orientation: int  # EXIF, 1..8
    width: int  # as stored (before the orientation)
    height: int


def read_jpeg(path: str, max_pixels: int = MAX_PIXELS) -> EncodedJpeg | None:
    """The bytes, EXIF orientation and stored size of a JPEG the device may decode; None
    for any other file (left to :func:`~pipeline.vision.images.load_rgb`, which decodes
    it or says why not). Only the header is parsed before the size is checked."""
    try:
        _check_file(path)  # a FIFO or a folder is never opened
        with open(path, "rb") as file:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(file)  # the header only
            width, height = image.size
            if not _plain(image, max_pixels):
                return None
            orientation = exif_orientation(image)
            file.seek(0)
            data = bytearray(file.read())
    except Exception:  # ImageSkipped, OSError, a header PIL refuses: load_rgb says why
        return None
    if not data.endswith(_END_OF_IMAGE):  # truncated (or trailing bytes): PIL decides
        return None
    return EncodedJpeg(torch.frombuffer(data, dtype=torch.uint8), orientation, width, height)


def _plain(image: Image.Image, max_pixels: int) -> bool:
    """Whether an opened image is a JPEG any decoder turns into PIL's RGB: YCbCr or gray
    (not CMYK, nor RGB stored untransformed, which an Adobe marker says), of a size PIL
    would decode."""
    width, height = image.size
    return (image.format == "JPEG" and image.mode in _JPEG_MODES
            and image.info.get("adobe_transform") != 0 and 0 < width * height <= max_pixels)


def oriented(x: torch.Tensor, orientation: int) -> torch.Tensor:
    """[C, H, W] as ``ImageOps.exif_transpose`` turns an image of this EXIF orientation."""
    if orientation == 2:
        return x.flip(-1)
    if orientation == 3:
        return x.flip(-2, -1)
    if orientation == 4:
        return x.flip(-2)
    if orientation == 5:
        return x.transpose(-2, -1)
    if orientation == 6:
        return x.rot90(-1, (-2, -1))  # PIL's ROTATE_270: clockwise
    if orientation == 7:
        return x.transpose(-2, -1).flip(-2, -1)
    if orientation == 8:
        return x.rot90(1, (-2, -1))  # PIL's ROTATE_90: anticlockwise
    return x


class JpegDataset(ImageDataset):
    """:class:`~pipeline.vision.images.ImageDataset` whose plain JPEGs stay undecoded.

    An item holds ``"jpeg"`` (the bytes, ``"image"`` None) with ``"orientation"``, and
    ``"height"``/``"width"`` after the orientation as from the header; any other image is
    the PIL path's item (``"jpeg"`` None). ``"path"`` lets the loop fall back to PIL.
    """

    def __getitem__(self, i: int) -> dict:
        image_id, path = self.items[i]
        encoded = read_jpeg(path, self.max_pixels)
        if encoded is None:
            return {**super().__getitem__(i), "jpeg": None, "orientation": 1, "path": path}
        width, height = encoded.width, encoded.height
        if encoded.orientation in (5, 6, 7, 8):  # a quarter turn or a transposition
            width, height = height, width
        return {"image_id": image_id, "image": None, "height": height, "width": width,
                "skipped": None, "jpeg": encoded.data, "orientation": encoded.orientation,
                "path": path}


def collate_jpegs(batch: list[dict]) -> dict:
    """:func:`~pipeline.vision.images.collate_images`, with ``"jpegs"``, ``"orientations"``
    and ``"paths"`` beside ``"images"`` (an image is either loaded or a JPEG's bytes)."""
    out = collate_images(batch)
    loaded = [item for item in batch if item["skipped"] is None]
    out["jpegs"] = [item["jpeg"] for item in loaded]
    out["orientations"] = [item["orientation"] for item in loaded]
    out["paths"] = [item["path"] for item in loaded]
    return out


class JpegDecoder:
    """Decodes a batch's JPEGs on ``device`` (all at once), orients, resizes and normalises
    them as ``transform`` does; the loop calls it on each batch of :meth:`dataset`'s."""

    def __init__(self, transform: GridTransform, device: torch.device):
        self.transform = transform
        self.device = torch.device(device)
        self._stats: tuple[torch.Tensor, torch.Tensor] | None = None

    def dataset(self, items: Sequence[tuple[int, str | Path]]) -> JpegDataset:
        return JpegDataset(items, self.transform)

    collate = staticmethod(collate_jpegs)

    def __call__(self, batch: dict) -> dict:
        """The batch with every image a float32 [3, size, size] on the device; a JPEG the
        decoder refuses is loaded with PIL instead, or skipped with PIL's reason."""
        where = [k for k, data in enumerate(batch["jpegs"]) if data is not None]
        decoded = dict(zip(where, self.decode([batch["jpegs"][k] for k in where])))
        out: dict = {"image_ids": [], "images": [], "heights": [], "widths": [],
                     "skipped": list(batch["skipped"])}
        for k, image_id in enumerate(batch["image_ids"]):
            image, height, width = batch["images"][k], batch["heights"][k], batch["widths"][k]
            if k in decoded:
                image = self.prepared(decoded[k], batch["orientations"][k], height, width)
            if image is None:  # the device refused it: PIL, as the workers would
                item = ImageDataset([(image_id, batch["paths"][k])], self.transform)[0]
                if item["skipped"] is not None:
                    out["skipped"].append((image_id, item["skipped"]))
                    continue
                image, height, width = item["image"], item["height"], item["width"]
            out["image_ids"].append(image_id)
            out["images"].append(image.to(self.device, non_blocking=True))
            out["heights"].append(height)
            out["widths"].append(width)
        return out

    def decode(self, jpegs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """uint8 [3, H, W] of each JPEG on the device, all in one call; one by one when the
        call fails (nvJPEG gives no partial results), None for each that fails alone."""
        from torchvision.io import ImageReadMode, decode_jpeg

        if not jpegs:
            return []
        try:
            with warnings.catch_warnings():  # torchvision 0.29 deprecates it for TorchCodec
                warnings.simplefilter("ignore", DeprecationWarning)
                return list(decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=self.device))
        except RuntimeError:
            if len(jpegs) == 1:
                return [None]
            return [self.decode([data])[0] for data in jpegs]

    def prepared(self, x: torch.Tensor | None, orientation: int, height: int,
                 width: int) -> torch.Tensor | None:
        """The decoded pixels oriented, resized and normalised; None when they are not the
        size the header said (the file is then PIL's to judge)."""
        if x is None:
            return None
        x = oriented(x, orientation)
        if tuple(x.shape) != (3, height, width):
            return None
        if self._stats is None:
            self._stats = self.transform.stats(self.device)
        return self.transform.normalise(self.transform.resize(x), *self._stats)

    def __repr__(self) -> str:
        return f"JpegDecoder({self.transform!r}, device={self.device})"
