"""ruotianluo/self-critical.pytorch's feature layouts: npz folders and their LMDB dumps.

``scripts/make_bu_data.py`` turns the BUTD TSV into ``<dir>_att/<cocoid>.npz``
(key ``feat``, float32 ``[N, 2048]``; ``z`` in its ``cocotest_bu``),
``<dir>_box/<cocoid>.npy`` (float32 ``[N, 4]``, x1, y1, x2, y2 in image
pixels) and ``<dir>_fc/<cocoid>.npy`` (the mean of the att rows: derived, not
imported). ``scripts/prepro_feats.py`` writes the ResNet grid the same way, att
``feat`` of shape ``[14, 14, 2048]``: those import as a grid store.
``scripts/dump_to_lmdb.py`` packs a folder into ``<dir>_att.lmdb`` with
lmdbdict (one file, ascii id keys, each value the raw bytes of the npz or npy
file; reserved ``__keys__``, ``__value_dumps__``... entries hold pickles, read
here with the restricted unpickler). None of them records the image size:
``--image-root`` reads it from the images.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core import safe_pickle
from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import FORMATS, WRITERS
from pipeline.features.interchange.formats.base import (BadRow, FeatureFormat, Step, bounded,
                                                        existing, open_regular, readable)
from pipeline.features.interchange.formats.folder import folder_steps, listing
from pipeline.features.interchange.formats.lmdb_source import data_file, lmdb_steps, open_lmdb
from pipeline.features.stores import Record, StoreReader

FEATURE_KEYS = ("feat", "z")  # "z": how cocotest_bu's files were saved


def att_and_box(source: Path, suffix: str = "") -> tuple[Path, Path | None]:
    """``<dir>_att<suffix>`` (given as itself or as ``<dir>``) and its ``_box`` sibling if any."""
    name = source.name[:-len(suffix)] if suffix and source.name.endswith(suffix) else source.name
    if not name.endswith("_att"):
        if source.with_name(f"{name}_att{suffix}").exists():
            name += "_att"
        else:
            raise CapstackError(f"{source}: expected a <name>_att{suffix} (or <name> beside "
                                f"<name>_att{suffix}) of self-critical.pytorch")
    att = source.with_name(name + suffix)
    box = source.with_name(name[:-len("_att")] + "_box" + suffix)
    return existing([att], "att features")[0], box if box.exists() else None


class RtlGrid:
    """What the att arrays are: regions ``[N, D]`` or a ``[k, k, D]`` grid (flattened)."""

    def __init__(self, fmt: FeatureFormat):
        self.fmt = fmt

    def rows(self, feat: np.ndarray) -> np.ndarray:
        if feat.ndim == 3:
            if feat.shape[0] != feat.shape[1]:
                raise BadRow(f"att feat of shape {list(feat.shape)}: a grid must be square")
            if self.fmt.grid is None:
                self.fmt.grid = int(feat.shape[0])
            return feat.reshape(-1, feat.shape[2])
        if feat.ndim != 2:
            raise BadRow(f"att feat of shape {list(feat.shape)}, expected [N, D] or [k, k, D]")
        return feat


def att_record(arrays, where: str, grid: RtlGrid, boxes: np.ndarray | None) -> Record:
    if isinstance(arrays, np.ndarray):  # an .npy att file
        feat = arrays
    else:
        key = next((k for k in FEATURE_KEYS if k in arrays), None)
        if key is None:
            raise BadRow(f"no 'feat' (or 'z') array, only {', '.join(arrays) or 'nothing'}")
        feat = arrays[key]
    features = grid.rows(np.asarray(feat))
    if boxes is None:
        return Record(features, 0, 0)
    boxes = np.asarray(boxes)
    if boxes.shape != (features.shape[0], 4):
        raise BadRow(f"box array of shape {list(boxes.shape)} for {features.shape[0]} att rows")
    return Record(features, 0, 0, boxes=boxes)


def _read(path: Path, where: str):
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        bounded((size,), 1, str(path))
        data = handle.read()
    return readable(safe_pickle.load_array, data, where)


@FORMATS.register("rtl-npz")
class RtlNpz(FeatureFormat):
    """self-critical.pytorch's <dir>_att/<id>.npz (+ <dir>_box/<id>.npy) folders, regions or grid"""

    name = "rtl-npz"
    records_sizes = False

    def units(self, sources: list[Path]) -> list[Path]:
        return [att_and_box(source)[0] for source in sources]

    def content(self, unit: Path) -> list[Path]:
        att, box = att_and_box(unit)
        return [att] + ([box] if box else [])

    def steps(self, unit: Path, start) -> Iterator[Step]:
        att, box = att_and_box(unit)
        grid = RtlGrid(self)

        def read(path: Path) -> Record:
            boxes = None
            if box is not None:
                box_file = box / f"{path.name.split('.')[0]}.npy"
                if not box_file.exists():
                    raise BadRow(f"no box file {box_file}")
                boxes = _read(box_file, str(box_file))
            return att_record(_read(path, str(path)), str(path), grid, boxes)

        files = listing(att, ".npz") or listing(att, ".npy")
        return folder_steps(files, start, read)

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "ruotianluo/self-critical.pytorch scripts/make_bu_data.py, "
                          "prepro_feats.py"}


@FORMATS.register("rtl-lmdb")
class RtlLmdb(FeatureFormat):
    """self-critical.pytorch's dump_to_lmdb.py: <dir>_att.lmdb (+ _box.lmdb), raw npz/npy values"""

    name = "rtl-lmdb"
    records_sizes = False

    def units(self, sources: list[Path]) -> list[Path]:
        return [att_and_box(source, ".lmdb")[0] for source in sources]

    def content(self, unit: Path) -> list[Path]:
        att, box = att_and_box(unit, ".lmdb")
        return [data_file(att)] + ([data_file(box)] if box else [])

    def steps(self, unit: Path, start) -> Iterator[Step]:
        att, box = att_and_box(unit, ".lmdb")
        self._check_methods(att)
        grid = RtlGrid(self)
        boxes = open_lmdb(box) if box else None

        def decode(key: str, value: bytes, where: str) -> Record:
            box_array = None
            if boxes is not None:
                with boxes.begin() as txn:
                    raw = txn.get(key.encode())
                if raw is None:
                    raise BadRow(f"no entry {key!r} in {box}")
                box_array = readable(safe_pickle.load_array, raw, f"{box}[{key}]")
            return att_record(readable(safe_pickle.load_array, value, where), where, grid,
                              box_array)

        try:
            yield from lmdb_steps(att, start, decode)
        finally:
            if boxes is not None:
                boxes.close()

    @staticmethod
    def _check_methods(att: Path) -> None:
        """lmdbdict records how it encoded values: only raw file bytes are this layout."""
        env = open_lmdb(att)
        try:
            with env.begin() as txn:
                raw = txn.get(b"__value_dumps__")
        finally:
            env.close()
        if raw is not None:
            method = safe_pickle.loads(raw, f"{att}[__value_dumps__]")
            if not (method is None or (isinstance(method, str) and method == "identity")):
                raise CapstackError(f"{att}: lmdbdict values encoded with {_shown(method)}; "
                                    f"dump_to_lmdb.py stores raw npz/npy bytes ('identity')")

    def producer(self, units: list[Path]) -> dict:
        notes: dict[str, str | None] = {
            "layout": "ruotianluo/self-critical.pytorch scripts/dump_to_lmdb.py (lmdbdict)"}
        env = open_lmdb(units[0])
        try:
            with env.begin() as txn:
                for key in (b"__key_dumps__", b"__value_dumps__"):
                    raw = txn.get(key)
                    if raw is not None:
                        notes[key.decode().strip("_")] = _shown(safe_pickle.loads(
                            raw, f"{units[0]}[{key.decode()}]"))
        finally:
            env.close()
        return notes


def _shown(value) -> str | None:
    """An lmdbdict reserved entry as a method name, or a short account of anything else
    (the store's metadata is JSON, and an array or a set is no name)."""
    if value is None or isinstance(value, str):
        return value if value is None else value[:80]
    return f"a {type(value).__name__} ({repr(value)[:60]})"


@WRITERS.register("rtl-npz")
class RtlNpzWriter:
    """A store as make_bu_data.py's folders: ``<out>_att/<id>.npz`` (``feat``; ``[k, k, D]``
    for a grid), ``<out>_fc/<id>.npy`` (the mean row), ``<out>_box/<id>.npy`` (if boxes)."""

    def __init__(self, store: StoreReader, partials: list[Path]):
        for folder in partials:
            folder.mkdir(parents=True)
        self.att, self.fc = partials[0], partials[1]
        self.box = partials[2] if len(partials) > 2 else None
        self.grid = store.schema.grid

    @staticmethod
    def targets(store: StoreReader, out: Path) -> list[Path]:
        names = ["_att", "_fc"] + (["_box"] if store.schema.has("boxes") else [])
        return [out.with_name(out.name + suffix) for suffix in names]

    def write(self, image_id: int, record: Record) -> None:
        feat = record.features.astype(np.float32)
        np.save(self.fc / f"{image_id}.npy", feat.mean(0))
        if self.grid:
            feat = feat.reshape(self.grid, self.grid, -1)
        np.savez_compressed(self.att / f"{image_id}.npz", feat=feat)
        if self.box is not None:
            np.save(self.box / f"{image_id}.npy", record["boxes"].astype(np.float32))

    def close(self) -> None:
        """Nothing held open."""
