"""Run again, on new image files, the extractor that made a store (what `capstack caption` needs).

A store's metadata records its extractor, backbone, weights file and md5, image
size, grid or box settings. From those this module rebuilds the same extractor,
refusing with the reason when it cannot: the weights file is gone or has
changed, or the store's regions were the dataset's own boxes (``--boxes
given``), which new images do not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from pipeline.core.errors import CapstackError
from pipeline.features.extract import grid as grid_module
from pipeline.features.extract import region_extraction
from pipeline.features.extract.backbones import RANDOM, Weights, load_resnet, resnet_body
from pipeline.features.extract.images import (ImageDataset, collate_images, detector_transform,
                                     grid_transform)
from pipeline.core.hashing import md5_of_file
from pipeline.features.stores import Record

Extract = Callable[[Sequence[Path]], list[Record]]


def checked_weights(meta: dict, where: str) -> str:
    """The store's weights file, present and unchanged (or "random")."""
    path, md5 = meta.get("weights"), meta.get("weights_md5")
    if path == RANDOM:
        return RANDOM
    if not path or not Path(path).is_file():
        raise CapstackError(f"{where}: its features came from the weights {path} (md5 {md5}), "
                            f"which are not here: put that file back to caption new images")
    actual = md5_of_file(Path(path))
    if actual != md5:
        raise CapstackError(f"{where}: {path} changed since the features were extracted "
                            f"(md5 {actual}, the store says {md5})")
    return path


def image_extractor(meta: dict, where: str, device: torch.device) -> Extract:
    """``extract(paths) -> records``, as the store at ``where`` was made."""
    weights = checked_weights(meta, where)
    if meta["kind"] == "grid":
        model = load_resnet(meta["backbone"], Weights(weights, meta["weights_md5"]))
        extractor = grid_module.GridExtractor(resnet_body(model), int(meta["grid"]))
        run = grid_module.batch_model(extractor.eval().to(device), device)
        transform = grid_transform(int(meta["image_size"]))
    else:
        run = _region_model(meta, weights, where, device)
        transform = detector_transform()

    def extract(paths: Sequence[Path]) -> list[Record]:
        dataset = ImageDataset(list(enumerate(paths)), transform)
        batch = collate_images([dataset[k] for k in range(len(dataset))])
        if batch["skipped"]:
            index, reason = batch["skipped"][0]
            raise CapstackError(f"{paths[index]}: {reason}")
        return run(batch)

    return extract


def _region_model(meta: dict, weights: str, where: str, device: torch.device):
    s = meta["settings"]
    if s.get("boxes") == "given":
        raise CapstackError(f"{where}: its regions are the dataset's own boxes (--boxes given), "
                            f"and new images have none: caption with a checkpoint trained on grid "
                            f"features or detected regions")
    settings = region_extraction.RegionSettings(
        arch=s["arch"], backbone=meta["backbone"], weights=weights, weights_kind=s["weights_kind"],
        boxes="detect", min_boxes=s["min_boxes"], max_boxes=s["max_boxes"],
        conf_thresh=s["conf_thresh"], nms_thresh=s["nms_thresh"], min_size=s["min_size"],
        max_size=s["max_size"], num_classes=s["num_classes"])
    extractor = region_extraction.build_extractor(settings, weights).eval().to(device)
    return region_extraction.batch_model(extractor, device, None)
