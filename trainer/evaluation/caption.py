"""Caption raw image files end to end with a checkpoint.

The checkpoint records the metadata of the stores it was trained on; the
caller passes ``extractor_for(meta, where)``, which rebuilds the extractor that
made each store from its ``producer`` (``pipeline.features.extract.rebuild``),
so the trainer itself never opens an image model. The features go through the
same padding, dtype and box geometry as in training, then beam search, or the decoding the
experiment's ``eval:`` block and the options given say (trainer/decoding/options.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pipeline.core.errors import CapstackError
from pipeline.features.stores.schema import Schema, check_meta
from trainer.batch import EvalBatch
from trainer.data import batch_from_records, combine
from trainer.decoding import DecodingConfig
from trainer.evaluation.ensembles import load_decoder
from trainer.evaluation.evaluate import eval_settings
from trainer.evaluation.figures import attention_figure
from trainer.evaluation.predict import predict


@dataclass
class Caption:
    path: Path
    words: list[str]
    logprob: float
    attention: Path | None
    regions: int | None = None  # how many regions the decoder attended over (region stores)
    rank: int = 1  # its place among the image's n captions, from 1


STEM, INDEX = "{stem}", "{n}"  # what --attention's file name may hold


def attention_files(pattern: Path, images: Sequence[Path]) -> list[Path]:
    """Where each image's attention picture goes: ``pattern`` itself for one image; for several,
    ``pattern`` with ``{stem}`` (the image file's name without its suffix) or ``{n}`` (its
    place among the images, 1 for the first) filled in, so that the file asked for is the file
    written. Refused, before anything runs, when two images would share a picture."""
    text = str(pattern)
    if len(images) > 1 and STEM not in text and INDEX not in text:
        raise CapstackError(
            f"--attention {pattern}: {len(images)} images need a picture each: put {STEM} (the "
            f"image's file name) or {INDEX} (its place, from 1) in the name, e.g. "
            f"{pattern.with_name(f'{pattern.stem}-{STEM}{pattern.suffix}')}")
    files = [Path(text.replace(STEM, Path(image).stem).replace(INDEX, str(k)))
             for k, image in enumerate(images, 1)]
    first: dict[Path, Path] = {}
    for image, file in zip(images, files):
        if file in first:
            raise CapstackError(f"--attention {pattern}: {first[file]} and {image} would both "
                                f"be drawn to {file}: use {INDEX} (their place) in the name")
        first[file] = Path(image)
    return files


CAPTION_BATCH = 16  # images decoded, extracted and beam-searched at once


def caption_files(checkpoint: str | Path | Sequence[str | Path], paths: Sequence[Path],
                  extractor_for: Callable[[dict, str], Callable], *,
                  beam_size: int | None = None, max_len: int = 16,
                  attention: Path | None = None, device="cpu",
                  decoding: DecodingConfig | Mapping[str, Any] | None = None) -> list[Caption]:
    """Each image file's caption (beam search), :data:`CAPTION_BATCH` images at a time (their
    pixels, features and beams are what memory holds, however many images are given; all at
    once, 200 images took 6.85 GB), and with ``attention`` its picture of where the decoder
    looked per word (:func:`attention_files` names them), drawn once every image is decoded,
    with a progress bar over the images (trainer/evaluation/predict.py).

    The decoding is the experiment's ``eval:`` options (its ``beam_size`` unless one is given)
    with ``max_len``, then ``decoding`` laid over them (a mapping: the options it names; a
    :class:`DecodingConfig`: all); with n captions per image, an image's come adjacent,
    ranked, and its picture is its first's. ``checkpoint`` as a list (or tuple), even of one:
    the runs' ensemble (trainer/ensemble.py), the first run's extractors and ``eval:`` options;
    it draws no attention."""
    figures = attention_files(attention, paths) if attention is not None else None
    loaded = load_decoder(checkpoint)  # an ensemble: refused unless one vocabulary, features
    ckpt, model, vocab, config = (loaded.members[0].checkpoint, loaded.model, loaded.vocab,
                                  loaded.config)
    model = model.to(device)
    if isinstance(decoding, DecodingConfig):
        decoding = asdict(decoding)
    given = {"max_len": max_len, **({} if beam_size is None else {"beam_size": beam_size})}
    options = eval_settings(config.eval, {**given, **dict(decoding or {})},
                            "capstack caption").decoding
    stores = [(s["path"], check_meta(s["meta"], s["path"])) for s in ckpt["stores"]]
    schemas = [Schema.from_meta(meta, where) for where, meta in stores]
    extractors = [extractor_for(meta, where) for where, meta in stores]
    grid = schemas[0].grid if len(schemas) == 1 else None

    def batches():
        for start in range(0, len(paths), CAPTION_BATCH):
            chunk = list(paths[start:start + CAPTION_BATCH])
            read = [batch_from_records(extract(chunk), schema.dtype, config.data.max_regions)
                    for extract, schema in zip(extractors, schemas)]
            feats, mask, boxes = combine(read, config.data.box_geometry)
            yield EvalBatch(list(range(start, start + len(chunk))), feats, mask, boxes)

    # every image decoded before a picture is drawn: a Ctrl-C while decoding leaves none
    preds = predict(model, vocab, batches(), device, options.decoding, progress=len(paths))
    out = []
    for p in preds:
        k = p.image_id  # the image's place among ``paths``
        path = paths[k]
        figure = None
        if figures is not None and p.rank == 1 and p.alphas is not None and \
                (grid or p.boxes is not None):
            figure = figures[k]
            attention_figure(path, p.words, p.alphas, figure, grid=grid,
                             boxes=None if grid else p.boxes, title=" ".join(p.words))
        out.append(Caption(Path(path), p.words, p.logprob, figure,
                           None if p.boxes is None else len(p.boxes), p.rank))
    return out
