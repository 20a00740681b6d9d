"""ResNet grid features: a conv stage's map, adaptively average-pooled to grid x grid.

Show-Attend-Tell and Stack-Cap attend over these cells. Stack-Cap: ResNet-101's
layer4 at 448 x 448, a 14 x 14 x 2048 map, 196 annotation vectors per image.
Show-Attend-Tell's 14 x 14 x 512 VGG conv5 grid at 224 has its nearest ResNet
counterpart in layer3 (stride 16: 14 x 14 x 1024 at 224), HACap's input too.
The layer, its map size at the image size and the pooled grid are part of the
store's settings (so of its fingerprint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipeline.core.ranks import pick_device
from pipeline.features.extract.backbones import (build_resnet, feature_channels, layer_map_size,
                                                 load_resnet, resnet_body, resolve_weights)
from pipeline.features.extract.images import grid_transform, stack_images
from pipeline.features.extract.job import ExtractionJob, JobResult, run_job
from pipeline.features.extract.runner import autocast
from pipeline.features.stores import Record, Schema, field

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
    dtype: str = "float16"
    layer: str = "layer4"  # or layer3 (stride 16)


def batch_model(extractor: GridExtractor, device: torch.device):
    """Records for a collated batch: forward on ``device``, features back as float32."""

    @torch.inference_mode()
    def run(batch: dict) -> list[Record]:
        images = stack_images(batch["images"]).to(device, non_blocking=True)
        if device.type == "cuda":
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(device):
            cells = extractor(images)
        cells = cells.float().cpu().numpy()
        return [Record(cells[k], h, w)
                for k, (h, w) in enumerate(zip(batch["heights"], batch["widths"]))]

    return run


def extract_grid(dataset_json: Path, image_root: Path, settings: GridSettings, *,
                 out: Path | None = None, root: Path | None = None, format: str | None = None,
                 pointer: Path | None = None, batch_size: int = 16, workers: int = 2,
                 device: str | None = None, progress: bool = True,
                 images_outside_root: bool = False) -> JobResult:
    weights = resolve_weights(settings.backbone, settings.weights)
    dev = pick_device(device)
    channels = feature_channels(build_resnet(settings.backbone), settings.layer)
    map_size = layer_map_size(settings.image_size, settings.layer)

    def make_model():
        model = load_resnet(settings.backbone, weights)
        extractor = GridExtractor(resnet_body(model, settings.layer), settings.grid).eval().to(dev)
        if dev.type == "cuda":
            extractor = extractor.to(memory_format=torch.channels_last)
        return batch_model(extractor, dev)

    job = ExtractionJob(
        kind="grid", backbone=settings.backbone, dataset_json=Path(dataset_json),
        image_root=Path(image_root), dtype=settings.dtype, out=out, root=root, format=format,
        images_outside_root=images_outside_root,
        schema=Schema((field("features", (channels,), settings.dtype),), grid=settings.grid),
        settings={"extractor": "extract-grid", "features_version": FEATURES_VERSION,
                  "weights_md5": weights.md5, "image_size": settings.image_size,
                  "layer": settings.layer, "layer_map": map_size, "grid": settings.grid,
                  "feature_dim": channels},
        describe={"weights": weights.path,
                  "layer": f"{settings.layer} ({map_size}x{map_size} at {settings.image_size} "
                           f"px), adaptive average pool to {settings.grid}x{settings.grid}"},
    )
    return run_job(job, make_model, grid_transform(settings.image_size), batch_size=batch_size,
                   workers=workers, pointer=pointer, progress=progress,
                   pin_memory=dev.type == "cuda")
