"""Run again, on new image files, the extractor that made a store (what `capstack caption` needs).

A store's metadata records its producer: the extractor's name, the settings
its fingerprint covers (backbone, weights md5, image size, grid or box settings)
and the weights file. From those this module rebuilds the same extractor,
refusing with the reason when it cannot: the weights file is gone or has
changed, or the store's regions were the dataset's own boxes (``--boxes
given``), which new images do not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.features.extract import grid as grid_module
from pipeline.features.extract import region_extraction
from pipeline.features.extract.backbones import RANDOM, Weights, load_resnet, resnet_body
from pipeline.features.extract.images import (ImageDataset, collate_images, detector_transform,
                                              grid_transform)
from pipeline.features.stores import Record

Extract = Callable[[Sequence[Path]], list[Record]]


def checked_weights(producer: dict, where: str) -> str:
    """The store's weights file, present and unchanged (or "random")."""
    path, md5 = producer["about"].get("weights"), producer["settings"].get("weights_md5")
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
    """``extract(paths) -> records``, as the store at ``where`` was made (its ``producer``)."""
    producer = meta["producer"]
    rebuild = REBUILDERS.get(producer["name"])
    if producer["name"] == "import-features":
        raise CapstackError(
            f"{where}: its features were imported from {producer['settings']['format']} files, "
            f"and no extractor that capstack can run made them, so new images cannot get such "
            f"features: caption with a checkpoint trained on features capstack extracted")
    if rebuild is None:
        raise CapstackError(f"{where}: its features were made by {producer['name']!r}, which "
                            f"capstack cannot run on new images (it reruns "
                            f"{', '.join(sorted(REBUILDERS))})")
    run, transform = rebuild(producer, checked_weights(producer, where), where, device)

    def extract(paths: Sequence[Path]) -> list[Record]:
        dataset = ImageDataset(list(enumerate(paths)), transform)
        batch = collate_images([dataset[k] for k in range(len(dataset))])
        if batch["skipped"]:
            index, reason = batch["skipped"][0]
            raise CapstackError(f"{paths[index]}: {reason}")
        return run(batch)

    return extract


def _grid(producer: dict, weights: str, where: str, device: torch.device):
    s = producer["settings"]
    model = load_resnet(s["backbone"], Weights(weights, s["weights_md5"]))
    extractor = grid_module.GridExtractor(resnet_body(model, s.get("layer", "layer4")),
                                          int(s["grid"]))
    return (grid_module.batch_model(extractor.eval().to(device), device),
            grid_transform(int(s["image_size"])))


def _regions(producer: dict, weights: str, where: str, device: torch.device):
    s = producer["settings"]
    if s.get("boxes") == "given":
        raise CapstackError(f"{where}: its regions are the dataset's own boxes (--boxes given), "
                            f"and new images have none: caption with a checkpoint trained on grid "
                            f"features or detected regions")
    settings = region_extraction.RegionSettings(
        arch=s["arch"], backbone=s["backbone"], weights=weights,
        weights_kind=s.get("weights_kind", "auto"), boxes="detect", min_boxes=s["min_boxes"],
        max_boxes=s["max_boxes"], conf_thresh=s["conf_thresh"], nms_thresh=s["nms_thresh"],
        min_size=s["min_size"], max_size=s["max_size"], num_classes=s.get("num_classes", 91),
        top_attributes=s.get("top_attributes", 1))
    extractor = region_extraction.build_extractor(settings, weights, s["weights_md5"])
    extractor = extractor.eval().to(device)
    return (region_extraction.batch_model(extractor, device, None),
            detector_transform(settings.min_size, settings.max_size))


REBUILDERS = {"extract-grid": _grid, "extract-regions": _regions}  # producer -> its extractor
