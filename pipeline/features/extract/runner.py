"""The extraction loop shared by grid and region extractors.

Images are decoded and transformed in DataLoader workers; the model runs on
whole batches; each batch's records (and its skipped images) are committed to
the store at once. Images the store already holds are not read again, which
is how a killed extraction resumes. Ctrl-C stops at the next batch boundary,
with every finished batch kept.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.utils.data import DataLoader

from pipeline.core.errors import CapstackError
from pipeline.core.interrupt import stop_at_batch_boundary
from pipeline.vision.images import ImageDataset, collate_images
from pipeline.features.stores import Record, StoreWriter

BatchModel = Callable[[dict], list[Record]]


@dataclass
class LoopReport:
    extracted: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.extracted / self.seconds if self.seconds else 0.0


NO_REGIONS = "no regions (0 boxes): nothing to caption from"


def run_extraction(items: Sequence[tuple[int, Path]], writer: StoreWriter,
                   model: BatchModel | None, transform, *, batch_size: int, workers: int,
                   progress: bool = True, pin_memory: bool = False) -> LoopReport:
    """Extract every (image_id, path) not yet in ``writer`` and commit batch by batch; a
    skipped image is recorded as ``PATH: reason``."""
    from tqdm import tqdm

    todo = [(i, p) for i, p in items if int(i) not in writer.done]
    report = LoopReport()
    if not todo:
        return report
    assert model is not None, "images to extract need the model (None: every image is done)"
    if writer.done:
        tqdm.write(f"resuming: {len(items) - len(todo)} of {len(items)} images already in "
                   f"{writer.partial}", file=sys.stderr)
    loader = DataLoader(ImageDataset(todo, transform), batch_size=batch_size,
                        num_workers=workers, collate_fn=collate_images, pin_memory=pin_memory,
                        persistent_workers=False)
    paths = {int(i): p for i, p in todo}
    started = time.perf_counter()
    bar = tqdm(total=len(todo), desc=writer.meta["producer"]["name"], unit="img",
               disable=not progress, initial=0)
    with stop_at_batch_boundary() as state, bar:
        for batch in loader:
            records = model(batch) if batch["image_ids"] else []
            skipped = [(i, f"{paths[int(i)]}: {reason}") for i, reason in batch["skipped"]]
            found = list(zip(batch["image_ids"], records))
            skipped += [(i, f"{paths[int(i)]}: {NO_REGIONS}") for i, r in found if not r.num]
            found = [(i, r) for i, r in found if r.num]
            writer.write(found, skipped)
            report.extracted += len(found)
            report.skipped += skipped
            bar.update(len(batch["image_ids"]) + len(batch["skipped"]))
            bar.set_postfix(skipped=len(report.skipped), refresh=False)
            if state["stop"]:
                report.seconds = time.perf_counter() - started
                raise CapstackError(
                    f"interrupted: {len(writer.done)} of {len(items)} images are in "
                    f"{writer.partial}; run the same command again to resume")
    report.seconds = time.perf_counter() - started
    return report


def autocast(device: torch.device, half: bool = True):
    """float16 autocast on CUDA (unless ``half`` is False); nothing on the CPU (where it would
    only slow down)."""
    if device.type == "cuda" and half:
        return torch.autocast("cuda", dtype=torch.float16)
    return torch.autocast(device.type, enabled=False)
