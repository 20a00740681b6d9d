"""Grid features: a conv stage's map, adaptively average-pooled to grid x grid.

Show-Attend-Tell and Stack-Cap attend over these cells. Stack-Cap: ResNet-101's
layer4 at 448 x 448, a 14 x 14 x 2048 map, 196 annotation vectors per image.
Show-Attend-Tell's own grid is VGG-19's conv5_4 at 224 (``--backbone vgg19 --layer
conv5_4``: 14 x 14 x 512, with the user's weights); its nearest ResNet counterpart is
layer3 (stride 16: 14 x 14 x 1024 at 224), HACap's input too.
The layer, its map size at the image size and the pooled grid are part of the
store's settings (so of its fingerprint); so is ``decode`` when it is not the default
``cpu``: another decoder (``device``: nvJPEG on a GPU, pipeline/vision/jpeg.py) may
give other pixels, so other features.

The kind ``grid`` (:class:`Grid`, settings :class:`GridSettings`), run by
``capstack extract-grid``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from pipeline.core.errors import CapstackError
from pipeline.features.extract.kinds import EXTRACTORS
from pipeline.features.extract.job import Extraction, JobResult, extract
from pipeline.features.extract.kinds.base import ExtractorKind, half_precision, store_dtype
from pipeline.features.extract.runner import BatchModel, autocast
from pipeline.features.stores import Record, Schema, field
from pipeline.vision.backbones import (Weights, checked_layer, grid_channels, grid_trunk,
                                       layer_map_size, load_backbone, resolve_weights)
from pipeline.vision.images import grid_transform, stack_images
from pipeline.vision.jpeg import DECODES, JpegDecoder

FEATURES_VERSION = 1  # bump when the same settings start giving other features


class GridExtractor(nn.Module):
    def __init__(self, body: nn.Module, grid: int):
        super().__init__()
        self.body = body
        self.pool = nn.AdaptiveAvgPool2d(grid)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        fmap = self.pool(self.body(images))  # [B, C, grid, grid]
        return fmap.flatten(2).transpose(1, 2)  # [B, grid*grid, C], cells row-major


@dataclass
class GridSettings:
    backbone: str = "resnet101"
    weights: str | None = None  # a path, "random", or None for torchvision's cache
    image_size: int = 448
    grid: int = 14
    dtype: str | None = None  # float16; float32 for random weights (store_dtype)
    layer: str = "layer4"  # or layer3 (stride 16); conv5_4 for vgg19
    decode: str = "cpu"  # PIL in the workers; device: JPEGs decoded on the extraction device


def batch_model(extractor: GridExtractor, device: torch.device, half: bool = True):
    """Records for a collated batch: forward on ``device`` (in float16 on a GPU when ``half``),
    features back as float32. The records come back unfinished (runner.finished makes them):
    on a GPU the copy to the host is queued behind the forward pass, into pinned memory, and
    only the writer thread waits for it, while the loop's thread queues the next batch."""

    @torch.inference_mode()
    def run(batch: dict) -> Callable[[], list[Record]]:
        images = stack_images(batch["images"]).to(device, non_blocking=True)
        if device.type == "cuda":
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(device, half):
            cells = extractor(images).float()  # [B, grid*grid, C]
        host, landed = to_host(cells)
        sizes = list(zip(batch["heights"], batch["widths"]))

        def records() -> list[Record]:
            if landed is not None:
                landed.synchronize()
            array = host.numpy()
            return [Record(array[k], h, w) for k, (h, w) in enumerate(sizes)]

        return records

    return run


def to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A host copy of ``tensor`` and, for a CUDA tensor, the event it has landed at (the copy
    is queued on the stream, into pinned memory); a CPU tensor is its own copy."""
    if tensor.device.type != "cuda":
        return tensor, None
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    landed = torch.cuda.Event()
    landed.record()
    return host, landed


class Grid(ExtractorKind):
    """Grid features: a stage's map (ResNet layer4 or layer3, VGG-19 conv5_4) pooled to cells."""

    command = "extract-grid"
    Settings = GridSettings

    def prepare(self, s: GridSettings, dataset_json: Path, device: torch.device) -> Extraction:
        checked_layer(s.layer, s.backbone)
        checked_decode(s.decode)
        weights = resolve_weights(s.backbone, s.weights)
        channels = grid_channels(s.backbone, s.layer)
        map_size = layer_map_size(s.image_size, s.layer)
        dtype = store_dtype(s.dtype, s.weights)
        transform = grid_transform(s.image_size)
        return Extraction(
            kind="grid", backbone=s.backbone, dtype=dtype,
            schema=Schema((field("features", (channels,), dtype),), grid=s.grid),
            settings={"extractor": self.command, "features_version": FEATURES_VERSION,
                      "weights_md5": weights.md5, "image_size": s.image_size,
                      "layer": s.layer, "layer_map": map_size, "grid": s.grid,
                      "feature_dim": channels, **decode_setting(s.decode)},
            describe={"weights": weights.path,
                      "layer": f"{s.layer} ({map_size}x{map_size} at {s.image_size} px), "
                               f"adaptive average pool to {s.grid}x{s.grid}"},
            make_model=lambda: self.model(s, weights, device),
            transform=transform, pin_memory=device.type == "cuda",
            decoder=JpegDecoder(transform, device) if s.decode == "device" else None)

    def model(self, s: GridSettings, weights: Weights, device: torch.device) -> BatchModel:
        model = load_backbone(s.backbone, weights)
        extractor = GridExtractor(grid_trunk(model, s.layer), s.grid).eval().to(device)
        if device.type == "cuda":
            extractor = extractor.to(memory_format=torch.channels_last)
        return batch_model(extractor, device, half_precision(weights.path))

    def rebuild(self, s: GridSettings, weights_md5: str, where: str, device: torch.device):
        assert s.weights is not None, "rebuilt settings hold the store's weights"
        return self.model(s, Weights(s.weights, weights_md5), device), grid_transform(s.image_size)


def checked_decode(decode: str) -> None:
    if decode not in DECODES:
        raise CapstackError(f"--decode {decode!r}: unknown (choose {', '.join(DECODES)})")


def decode_setting(decode: str) -> dict:
    """The fingerprinted setting of the decoder: none for the default (PIL in the workers),
    so that every store made before the option keeps its name."""
    return {} if decode == GridSettings.decode else {"decode": decode}


GRID = EXTRACTORS.register("grid")(Grid("grid"))


def extract_grid(dataset_json: Path, image_root: Path, settings: GridSettings, *,
                 batch_size: int = 16, **options) -> JobResult:
    """``capstack extract-grid``: :func:`~pipeline.features.extract.job.extract` with the grid
    kind's settings (``options``: out, root, format, pointer, workers, device, progress,
    images_outside_root)."""
    return extract(dataset_json, image_root, settings, batch_size=batch_size, **options)
