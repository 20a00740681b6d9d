"""The prepare stage: a Karpathy json -> vocabulary, encoded captions, references.

``OUT_DIR`` after ``prepare_captions``:

``vocab.json``
    :class:`pipeline.captions.vocab.Vocabulary`, its words chosen by the vocabulary rule
    (pipeline/captions/vocab_rules/; by default the train split's, ``restval`` counting
    as train). With ``restval="drop"`` the restval images are left out of every file.
``captions.h5``
    images in the json's order, captions in each image's order:

    ============  =========================  ==========================================
    ``labels``    int32 [n_captions, max_len]  word ids, 0-padded, no <bos>/<eos>, truncated
    ``lengths``   int32 [n_captions]          words per caption after truncation (>= 1)
    ``label_start`` / ``label_end``  int64 [n_images]  the image's caption rows [start, end)
    ``image_ids`` int64 [n_images]            cocoid, else imgid
    ``split``     uint8 [n_images]            0 train (restval included), 1 val, 2 test;
                                              attribute ``split_names`` names the codes
    ============  =========================  ==========================================

    attributes: ``max_len``, ``min_count``, ``vocab_rule``, ``restval``, ``vocab_size``,
    ``dataset``, ``dataset_json``; with a lemmatiser (``--lemmatize``, lemmatize.py) also
    ``lemmatizer`` and ``lemmatizer_version``, its name and installed version.
``refs_{split}.json``
    the split's references, untruncated, in the COCO caption-annotation format
    pycocoevalcap's ``COCO()`` reads: every metric, validation, the rewards and the CIDEr-D
    cache (``cider_df``) compare with these. Each caption is the sentence as written (``raw``);
    with a lemmatiser, the sentence's lemmatised tokens joined by spaces (lowercase, no
    punctuation: the words the labels encode, untruncated), and ``info`` records the
    lemmatiser (``lemmatizer``: its name and version).
``images_{split}.json``
    the split's image order: ``image_id``, ``row`` (index in ``captions.h5``),
    ``filepath``, ``filename``.
``summary.json``
    the counts this function returns (with a lemmatiser, ``lemmatizer``: its name and version).
``checksums.json``
    the md5 of each file above, checked whenever the folder is read (prepared.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from pipeline.captions.karpathy import KarpathyDataset, load_karpathy
from pipeline.captions.lemmatize import lemmatize_dataset
from pipeline.captions.lemmatizers import build_lemmatizer
from pipeline.captions.prepared import SPLIT_CODES, write_checksums
from pipeline.captions.vocab import UNK_ID, Vocabulary
from pipeline.captions.vocab_rules import DEFAULT_RULE, VOCAB_RULES
from pipeline.core.atomic import atomic_dir, check_replaceable
from pipeline.core.errors import CapstackError
from pipeline.core.hdf5files import written_whole

WRITER = "prepare"  # the command whose output folder this is (its marker says so)
OUT_SPLITS = ("train", "val", "test")
SPLIT_CODE = {**SPLIT_CODES, "restval": SPLIT_CODES["train"]}  # restval counts as train


RESTVAL = ("train", "drop")  # what restval images are: train images, or left out


def prepare_captions(dataset_json: str | Path, out_dir: str | Path, *, min_count: int = 5,
                     max_len: int = 16, vocab_rule: str = DEFAULT_RULE, restval: str = "train",
                     lemmatizer: str | None = None, progress: bool = False,
                     force: bool = False) -> dict:
    """Write the prepared captions of ``dataset_json`` into ``out_dir``; return the counts.

    ``lemmatizer`` (a name in LEMMATIZERS, pipeline/captions/lemmatizers/, None for none)
    lemmatises every caption word before the vocabulary is chosen, and the references with the
    same lemmas. An existing ``out_dir`` that capstack did not write is refused unless
    ``force``."""
    if min_count < 1:
        raise CapstackError(f"prepare: --min-count must be at least 1, got {min_count}")
    if max_len < 1:
        raise CapstackError(f"prepare: --max-len must be at least 1, got {max_len}")
    rule = VOCAB_RULES.get(vocab_rule)  # an unknown rule is named before any file is read
    if restval not in RESTVAL:
        raise CapstackError(f"prepare: --restval must be one of {', '.join(RESTVAL)}, "
                            f"got {restval!r}")
    lemmas = build_lemmatizer(lemmatizer) if lemmatizer else None  # a missing package: now
    check_replaceable(Path(out_dir).resolve(), WRITER, force=force, inputs=(dataset_json,))
    dataset = load_karpathy(dataset_json, images_inside_root=False)  # opens no image
    if restval == "drop":
        dataset = without_restval(dataset)
    if lemmas is not None:
        dataset = lemmatize_dataset(dataset, lemmas)
    vocab = rule(dataset, min_count)
    labels, lengths, starts, ends = encode_captions(dataset, vocab, max_len, progress)
    summary = {**_summary(dataset, vocab, max_len, min_count), "restval": restval}
    record = lemmas.record() if lemmas is not None else None
    if record is not None:  # only then: a folder prepared without one is byte for byte what it was
        summary["lemmatizer"] = record
    with atomic_dir(out_dir, WRITER, force=force, inputs=(dataset_json,)) as tmp:
        vocab.save(tmp / "vocab.json")
        _write_captions_h5(tmp / "captions.h5", dataset, vocab, labels, lengths, starts, ends,
                           max_len, min_count, str(dataset_json), restval, record)
        for split in OUT_SPLITS:
            images = dataset.split(split)
            _write_json(tmp / f"refs_{split}.json",
                        coco_references(images, dataset.name, lemmatizer=record))
            _write_json(tmp / f"images_{split}.json", [
                {"image_id": im.image_id, "row": im.index, "filepath": im.filepath,
                 "filename": im.filename} for im in images])
        _write_json(tmp / "summary.json", summary)
        write_checksums(tmp)  # last: the md5 of every file above, checked by load_captions
    return summary


def without_restval(dataset: KarpathyDataset) -> KarpathyDataset:
    """The dataset without its restval images (COCO's 82,783 train images, as Show, Attend and
    Tell trains on), the others renumbered in their order: an image's index is its row."""
    kept = [im for im in dataset.images if im.split != "restval"]
    if not any(im.split == "train" for im in kept):
        raise CapstackError(f"{dataset.path}: --restval drop leaves no train image")
    return dataclasses.replace(dataset, images=tuple(
        dataclasses.replace(im, index=k) for k, im in enumerate(kept)))


def encode_captions(dataset: KarpathyDataset, vocab: Vocabulary, max_len: int,
                    progress: bool = False):
    """All captions as one 0-padded id matrix, with lengths and per-image row ranges."""
    from tqdm import tqdm

    n_captions = sum(len(im.sentences) for im in dataset.images)
    labels = np.zeros((n_captions, max_len), dtype=np.int32)
    lengths = np.zeros(n_captions, dtype=np.int32)
    starts = np.zeros(len(dataset.images), dtype=np.int64)
    ends = np.zeros(len(dataset.images), dtype=np.int64)
    row = 0
    for i, im in enumerate(tqdm(dataset.images, desc="prepare", unit="img", disable=not progress)):
        starts[i] = row
        for sentence in im.sentences:
            ids = vocab.encode(sentence.tokens[:max_len])
            labels[row, :len(ids)] = ids
            lengths[row] = len(ids)
            row += 1
        ends[i] = row
    return labels, lengths, starts, ends


def coco_references(images, dataset_name: str, lemmatizer: dict | None = None) -> dict:
    """References in the COCO caption-annotation format (what pycocoevalcap reads).

    Without ``lemmatizer`` each caption is the sentence as written. With it (the record of
    the lemmatiser that :func:`lemmatize_dataset` ran on ``images``) each caption is the
    sentence's tokens, lemmatised there as the labels are, joined by spaces: every score and
    reward of a lemmatised folder compares lemmas with lemmas. ``info`` then names it."""
    info: dict[str, str | dict]
    if lemmatizer is None:  # as before lemmatising existed, byte for byte
        info = {"description": f"{dataset_name} references, written by capstack prepare"}
    else:
        info = {"description": f"{dataset_name} references, lemmatised by "
                               f"{lemmatizer['name']} {lemmatizer['version']}, written by "
                               f"capstack prepare", "lemmatizer": lemmatizer}
    return {
        "info": info,
        "licenses": [],
        "type": "captions",
        "images": [{"id": im.image_id, "file_name": im.relpath} for im in images],
        "annotations": [{"image_id": im.image_id, "id": s.sentid,
                         "caption": s.raw if lemmatizer is None else " ".join(s.tokens)}
                        for im in images for s in im.sentences],
    }


def _write_captions_h5(path, dataset, vocab, labels, lengths, starts, ends, max_len, min_count,
                       dataset_json, restval="train", lemmatizer=None):
    with written_whole(path) as f:  # built in memory: a full disk is Python's OSError, not HDF5's
        f.create_dataset("labels", data=labels, compression="gzip", compression_opts=1)
        f.create_dataset("lengths", data=lengths)
        f.create_dataset("label_start", data=starts)
        f.create_dataset("label_end", data=ends)
        f.create_dataset("image_ids", data=np.array([im.image_id for im in dataset.images],
                                                    dtype=np.int64))
        split = f.create_dataset("split", data=np.array(
            [SPLIT_CODE[im.split] for im in dataset.images], dtype=np.uint8))
        split.attrs["split_names"] = list(OUT_SPLITS)
        f.attrs.update({"max_len": max_len, "min_count": min_count, "vocab_rule": vocab.rule,
                        "restval": restval, "vocab_size": len(vocab),
                        "dataset": dataset.name, "dataset_json": dataset_json})
        if lemmatizer:
            f.attrs.update({"lemmatizer": lemmatizer["name"],
                            "lemmatizer_version": lemmatizer["version"]})


def _summary(dataset, vocab, max_len, min_count) -> dict:
    train_tokens = [t for im in dataset.split("train") for s in im.sentences for t in s.tokens]
    return {
        "dataset": dataset.name,
        "images": {s: len(dataset.split(s)) for s in OUT_SPLITS},
        "captions": {s: sum(len(im.sentences) for im in dataset.split(s)) for s in OUT_SPLITS},
        "vocab_size": len(vocab),
        "unk_tokens": sum(i == UNK_ID for i in vocab.encode(train_tokens)),  # <eos>-words too
        "truncated": sum(len(s.tokens) > max_len for im in dataset.images for s in im.sentences),
        "max_len": max_len,
        "min_count": min_count,
        "vocab_rule": vocab.rule,
    }


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data))
