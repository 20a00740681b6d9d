"""What a decoder's pictures are drawn from: the evaluated captions, their images, where to write.

Every attention decoder gets the same picture per image (its attention over the
grid cells or regions, :meth:`Pictures.attention`). A decoder with more to show
draws it in its own ``figures`` hook (Stack-Cap's caption per stage, HACap's
goals), from a :class:`Pictures`, naming the picture (:meth:`Pictures.draw`):
evaluation knows no decoder's kind, and no decoder imports evaluation.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.captions.prepared import Captions
from pipeline.captions.vocab import Vocabulary
from pipeline.core.errors import CapstackError
from trainer.batch import EvalBatch
from trainer.data import Features, batches_of
from trainer.decoding import Greedy
from trainer.evaluation.predict import Prediction, predict

log = logging.getLogger(__name__)


@dataclass
class Pictures:
    preds: list[Prediction]  # the first few evaluated captions (beam search)
    vocab: Vocabulary  # the checkpoint's
    features: Features
    captions: Captions  # the prepared captions (where each image's file is listed)
    out_dir: Path
    device: torch.device
    max_len: int
    _files: dict[int, Path] | None = field(default=None, repr=False)

    @property
    def grid(self) -> int | None:
        """k for one store of k x k grid cells; None for regions (drawn as boxes)."""
        return self.features.grid_size

    def batch(self) -> EvalBatch:
        """The features of the pictured images, on the device."""
        ids = [p.image_id for p in self.preds]
        return next(batches_of(self.features, ids, len(ids))).to(self.device)

    def greedy(self, model) -> list[Prediction]:
        """``model``'s greedy captions of the pictured images (with their attention)."""
        ids = [p.image_id for p in self.preds]
        batch = next(batches_of(self.features, ids, len(ids)))
        return predict(model, self.vocab, [batch], self.device, Greedy(self.max_len))

    def image(self, image_id: int) -> Path | None:
        """The image's file, when it can still be found (else said once, and None)."""
        path = self.files().get(image_id)
        if path is None or not path.is_file():
            log.warning("figure for image %s skipped: image file not found", image_id)
            return None
        return path

    def draw(self, what: str, image_id: int, *args, **kwargs) -> None:
        """The picture ``what`` (a name in figures.PER_IMAGE: attention, stages, goals) of
        ``args``/``kwargs`` into ``<out_dir>/<what>/<image id>.png``; a picture that cannot be
        drawn (an image that no longer loads) is said and skipped."""
        from trainer.evaluation.figures import PER_IMAGE

        try:
            PER_IMAGE[what](*args, self.out_dir / what / f"{image_id}.png", **kwargs)
        except CapstackError as error:
            log.warning("%s figure for image %s skipped: %s", what, image_id, error)

    def attention(self) -> None:
        """Every attention decoder's picture: where it looked for each word."""
        grid, preds = self.grid, self.preds
        if not preds or preds[0].alphas is None or (grid is None and preds[0].boxes is None):
            return  # no attention, or grid and regions concatenated: no single picture of them
        for p in preds:
            path = self.image(p.image_id)
            if path is not None:
                self.draw("attention", p.image_id, path, p.words, p.alphas,
                          grid=grid, boxes=None if grid else p.boxes, title=" ".join(p.words))

    def files(self) -> dict[int, Path]:
        """image id -> file, from the store's image root and the prepared image lists."""
        if self._files is None:
            root = Path(self.features.stores[0].meta.get("image_root", ""))
            self._files = {}
            for split in ("train", "val", "test"):
                listing = self.captions.folder / f"images_{split}.json"
                if listing.is_file():
                    for entry in json.loads(listing.read_text()):
                        self._files[entry["image_id"]] = \
                            root / entry.get("filepath", "") / entry["filename"]
        return self._files
