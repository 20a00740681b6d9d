"""Run again, on new image files, the extractor that made a store (what `capstack caption` needs).

A store's metadata records its producer: the command's name, the settings
its fingerprint covers (backbone, arch, weights md5, image size, grid or box
settings) and the weights file. The kind that made it (``maker_of``) fills its
settings dataclass from those (a setting an older store lacks keeps the
dataclass default) and rebuilds the same extractor, refusing with the reason
when it cannot: the weights file is gone or has changed, or the store's regions
were the dataset's own boxes (``--boxes given``), which new images do not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.features.extract.kinds import EXTRACTORS, maker_of
from pipeline.features.extract.runner import finished
from pipeline.features.stores import Record
from pipeline.vision.backbones import RANDOM
from pipeline.vision.images import ImageDataset, collate_images

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
    """``extract(paths) -> records``, as the store at ``where`` was made (its ``producer``):
    the kind that made it, its settings dataclass filled from the recorded settings."""
    producer = meta["producer"]
    if producer["name"] == "import-features":
        raise CapstackError(
            f"{where}: its features were imported from {producer['settings']['format']} files, "
            f"and no extractor that capstack can run made them, so new images cannot get such "
            f"features: caption with a checkpoint trained on features capstack extracted")
    kind = maker_of(producer)
    if kind is None:
        commands = sorted({k.command for _, k in EXTRACTORS.items()})
        raise CapstackError(f"{where}: its features were made by {producer['name']!r}, which "
                            f"capstack cannot run on new images (it reruns "
                            f"{', '.join(commands)})")
    recorded = producer["settings"]
    settings = kind.recorded(recorded, weights=checked_weights(producer, where))
    run, transform = kind.rebuild(settings, recorded["weights_md5"], where, device)

    def extract(paths: Sequence[Path]) -> list[Record]:
        dataset = ImageDataset(list(enumerate(paths)), transform)
        batch = collate_images([dataset[k] for k in range(len(dataset))])
        if batch["skipped"]:
            index, reason = batch["skipped"][0]
            raise CapstackError(f"{paths[index]}: {reason}")
        return finished(run(batch))

    return extract
