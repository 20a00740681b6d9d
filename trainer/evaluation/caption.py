"""Caption raw image files end to end with a checkpoint.

The checkpoint records the metadata of the stores it was trained on; the
caller passes ``extractor_for(meta, where)``, which rebuilds the extractor that
made each store (``pipeline.features.extract.rebuild.image_extractor``), so the
trainer itself never opens an image model. The features go through the same
padding, dtype and box geometry as in training, then beam search.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from trainer.checkpoint import load_checkpoint
from trainer.data import EvalBatch, batch_from_records, combine
from trainer.evaluation.evaluate import load_model
from trainer.evaluation.figures import attention_figure
from trainer.evaluation.predict import predict


@dataclass
class Caption:
    path: Path
    words: list[str]
    logprob: float
    attention: Path | None


def caption_files(checkpoint: str | Path, paths: Sequence[Path],
                  extractor_for: Callable[[dict, str], Callable], *, beam_size: int = 5,
                  max_len: int = 16, attention: Path | None = None, device="cpu") -> list[Caption]:
    ckpt = load_checkpoint(checkpoint)
    model, vocab, config = load_model(ckpt)
    batches = []
    for store in ckpt["stores"]:
        records = extractor_for(store["meta"], store["path"])(list(paths))
        batches.append(batch_from_records(records, store["meta"]["dtype"],
                                          config.data.max_regions))
    feats, mask, boxes = combine(batches, config.data.box_geometry)
    batch = EvalBatch(list(range(len(paths))), feats, mask, boxes)
    preds = predict(model.to(device), vocab, [batch], device, beam_size=beam_size, max_len=max_len)
    grid = (int(ckpt["stores"][0]["meta"]["grid"])
            if len(ckpt["stores"]) == 1 and ckpt["stores"][0]["kind"] == "grid" else None)
    out = []
    for k, (path, p) in enumerate(zip(paths, preds)):
        figure = None
        if attention is not None and p.alphas is not None and (grid or p.boxes is not None):
            figure = attention if len(paths) == 1 else \
                attention.with_name(f"{attention.stem}_{k}{attention.suffix}")
            image = np.asarray(Image.open(path).convert("RGB"))
            attention_figure(image, p.words, p.alphas, figure, grid=grid,
                             boxes=None if grid else p.boxes, title=" ".join(p.words))
        out.append(Caption(Path(path), p.words, p.logprob, figure))
    return out
