"""What a store's records hold, declared in its metadata: the store itself knows no extractor.

A record is one image: its ``height`` and ``width`` and named fields, each an
array with one row per location (``N`` varies from record to record)::

    "fields": {"features": {"shape": ["N", 2048], "dtype": "float16"},
               "boxes":    {"shape": ["N", 4],    "dtype": "float32"},
               "scores":   {"shape": ["N"],       "dtype": "float32"},
               "classes":  {"shape": ["N"],       "dtype": "int32"}},
    "grid": 7,            # optional: every record's rows are a 7 x 7 grid, row-major
    "producer": {"name": "extract-regions", "settings": {...}, "about": {...}},

``features`` is required (float16 or float32); any other field may be
declared (attribute ids and scores, object classes...). Backends read and write
whatever the schema declares. ``producer`` says what made the features, once:
the settings its fingerprint covers and what else it recorded (weights file,
layer); only the extractors read it (to caption new images).

Stores written before fields were declared (their metadata has ``kind`` grid
or regions and the settings twice) are read through :func:`upgrade_meta`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from pipeline.core.errors import CapstackError

FORMAT = 2
FEATURE_DTYPES = ("float16", "float32")
ROWS = "N"
REQUIRED_META = ("fields", "producer", "fingerprint", "capstack_version")


@dataclass(frozen=True)
class Field:
    name: str
    shape: tuple[int, ...]  # after the rows: () for one value a row, (4,) for a box
    dtype: np.dtype

    @property
    def row_size(self) -> int:
        return math.prod(self.shape)  # np.prod took 4 us: 8 calls a record read

    def to_meta(self) -> dict:
        return {"shape": [ROWS, *self.shape], "dtype": self.dtype.name}


def field(name: str, shape: tuple[int, ...], dtype) -> Field:
    return Field(name, tuple(int(s) for s in shape), np.dtype(dtype))


@dataclass(frozen=True)
class Schema:
    """The fields of every record (``features`` first) and how its rows are laid out."""

    fields: tuple[Field, ...]
    grid: int | None = None  # rows are a grid x grid map, row-major

    @property
    def features(self) -> Field:
        return self.fields[0]

    @property
    def feature_dim(self) -> int:
        return self.features.shape[0]

    @property
    def dtype(self) -> np.dtype:
        return self.features.dtype

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def has(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str) -> Field:
        return self.fields[self.names.index(name)]

    def to_meta(self) -> dict:
        meta = {"fields": {f.name: f.to_meta() for f in self.fields}}
        return {**meta, "grid": self.grid} if self.grid else meta

    def describe(self) -> str:
        """``7x7 grid, 512-d`` or ``rows of 2048-d, with boxes, scores, classes``."""
        layout = f"{self.grid}x{self.grid} grid, " if self.grid else "rows of "
        extra = [f.name for f in self.fields[1:]]
        return f"{layout}{self.feature_dim}-d" + (f", with {', '.join(extra)}" if extra else "")

    @classmethod
    def from_meta(cls, meta: Mapping, where: str) -> "Schema":
        """The schema a store's metadata declares (fields in their declared order, which is
        the order of a record's arrays in LMDB, ``features`` first)."""
        meta = upgrade_meta(dict(meta))
        declared = meta.get("fields")
        if not isinstance(declared, Mapping) or "features" not in declared:
            raise CapstackError(f"{where}: store metadata fields: must declare 'features'")
        fields = [_field_from_meta(name, spec, where)
                  for name, spec in sorted(declared.items(), key=lambda kv: kv[0] != "features")]
        features = fields[0]
        if len(features.shape) != 1 or features.dtype.name not in FEATURE_DTYPES:
            raise CapstackError(f"{where}: store metadata fields.features: expected shape "
                                f"[N, D] of {' or '.join(FEATURE_DTYPES)}, got "
                                f"{features.to_meta()}")
        grid = meta.get("grid")
        if grid is not None and (not isinstance(grid, int) or grid < 1):
            raise CapstackError(f"{where}: store metadata grid: expected a positive int, "
                                f"got {grid!r}")
        return cls(tuple(fields), grid)


def _field_from_meta(name: str, spec, where: str) -> Field:
    try:
        shape = spec["shape"]
        if shape[0] != ROWS or not all(isinstance(s, int) and s > 0 for s in shape[1:]):
            raise ValueError(f"shape {shape}")
        return field(name, shape[1:], np.dtype(spec["dtype"]))
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise CapstackError(f"{where}: store metadata fields.{name}: expected "
                            f"{{shape: [N, ...], dtype: ...}} ({error})") from None


def check_meta(meta, where: str) -> dict:
    """Refuse metadata that is not a store's (missing keys, bad fields); upgrade old stores."""
    if not isinstance(meta, dict):
        raise CapstackError(f"{where}: store metadata is not an object")
    meta = upgrade_meta(meta)
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CapstackError(f"{where}: store metadata lacks {', '.join(missing)}")
    Schema.from_meta(meta, where)
    return meta


# ------------------------------------------------------------------------- records


class Record:
    """One image's fields (``features`` [N, D] first, then any declared field), height, width."""

    def __init__(self, features: np.ndarray, height: int, width: int,
                 **fields: np.ndarray | None):
        self.fields = {"features": features,
                       **{name: value for name, value in fields.items() if value is not None}}
        self.height, self.width = int(height), int(width)

    @property
    def features(self) -> np.ndarray:
        return self.fields["features"]

    @property
    def num(self) -> int:
        return int(self.features.shape[0])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.fields[name]

    def get(self, name: str) -> np.ndarray | None:
        return self.fields.get(name)


def check_record(schema: Schema, image_id: int, record: Record, where: str) -> Record:
    """The record cast to the schema's dtypes, or a CapstackError naming the image and field."""
    undeclared = sorted(set(record.fields) - set(schema.names))
    if undeclared:
        raise CapstackError(f"{where}: image {image_id}: field {undeclared[0]!r} is not declared "
                            f"in the store's metadata (fields: {', '.join(schema.names)})")
    features = np.asarray(record.features)
    if features.ndim != 2 or features.shape[1] != schema.feature_dim:
        raise CapstackError(f"{where}: image {image_id}: features of shape {features.shape}, "
                            f"expected [N, {schema.feature_dim}]")
    n = features.shape[0]
    if n == 0:
        raise CapstackError(f"{where}: image {image_id}: a record with no regions (0 rows): "
                            f"nothing to caption from; it belongs in the store's skipped")
    if schema.grid and n != schema.grid ** 2:
        raise CapstackError(f"{where}: image {image_id}: {n} grid cells, expected "
                            f"{schema.grid}x{schema.grid}")
    out = {"features": _finite(features, schema.dtype, image_id, where)}
    for f in schema.fields[1:]:
        value = record.get(f.name)
        if value is None:
            raise CapstackError(f"{where}: image {image_id}: record without {f.name}")
        array = np.asarray(value).astype(f.dtype, copy=False)
        if array.shape != (n, *f.shape):
            raise CapstackError(f"{where}: image {image_id}: {f.name} of shape {array.shape}, "
                                f"expected {[n, *f.shape]}")
        out[f.name] = array
    return Record(height=record.height, width=record.width, **out)


def _finite(features: np.ndarray, dtype: np.dtype, image_id: int, where: str) -> np.ndarray:
    """``features`` in ``dtype``, refused when a value is not finite there (NaN, inf, or beyond
    float16's range). The check reads the extremes (NaN propagates to them) and the cast is
    torch's vectorised one: both a few times faster than numpy's on the 2048-wide rows."""
    if not representable(features, dtype):
        peak = float(np.nanmax(np.abs(features.astype(np.float64))))
        raise CapstackError(
            f"{where}: image {image_id}: non-finite feature values (largest magnitude "
            f"{peak:.3g}{' overflows float16' if dtype == np.float16 and peak > 65504 else ''}"
            f"); refusing to write them. Random deep networks produce such values: use "
            f"trained weights, or --dtype float32 when the magnitudes are genuine")
    return cast(features, dtype)


def representable(values: np.ndarray, dtype: np.dtype | type[np.floating]) -> bool:
    """Every value finite and within ``dtype``'s range (NaN propagates to the extremes)."""
    if not values.size:
        return True
    if values.dtype == np.float16 and np.dtype(dtype).kind == "f":
        return finite(values)  # float16 fits every float dtype: only finiteness is in question
    with np.errstate(invalid="ignore"):
        low, high = values.min(), values.max()
    limit = np.finfo(dtype).max
    return bool(-limit <= low and high <= limit)


def finite(values: np.ndarray) -> bool:
    """Every value finite. float16 by its exponent bits (all ones: infinity or NaN): numpy
    emulates float16 arithmetic, and isfinite, min or max of a 34 x 2048 record took 50 to
    300 us where the bits take 9."""
    if values.dtype == np.float16:
        return not ((values.view(np.uint16) & 0x7C00) == 0x7C00).any()
    return bool(np.isfinite(values).all())


def cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as ``dtype`` (itself when it already is)."""
    if array.dtype == dtype:
        return array
    if array.dtype == np.float32 and dtype == np.float16:
        import torch

        with warnings.catch_warnings():  # a read-only array (np.frombuffer) is only read here
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(np.ascontiguousarray(array))
        # torch's cast is ~25x numpy's (8 us a 34 x 2048 record, numpy 190) on one thread.
        # On its default threads a record is cut in halves that wait for each other: 10 ms a
        # record while another process (the extraction's own DataLoader workers) holds the
        # cores, 60 % of a store write on 2 busy cores (benchmarks/scale.py).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return source.to(torch.float16).numpy()
        finally:
            torch.set_num_threads(threads)
    return array.astype(dtype)


# ------------------------------------------------------------------------- the first format

V1_REGION_FIELDS = (("boxes", (4,), "float32"), ("scores", (), "float32"),
                    ("classes", (), "int32"))
V1_PRODUCER_KEYS = ("extractor", "backbone", "weights", "weights_md5", "layer", "image_size")


def upgrade_meta(meta: dict) -> dict:
    """Metadata of a store written before fields were declared, in today's form (else as is).

    Those stores said ``kind`` (grid: features only; regions: features, boxes,
    scores, classes, in that order) and kept their producer's settings both at
    the top level and under ``settings``; their records are laid out as today's
    with those fields, so only the metadata changes.
    """
    if "fields" in meta or "kind" not in meta:
        return meta
    fields = [field("features", (meta.get("feature_dim", 0),), meta.get("dtype", "float16"))]
    if meta["kind"] == "regions":
        fields += [field(*spec) for spec in V1_REGION_FIELDS]
    schema = Schema(tuple(fields), meta.get("grid") if meta["kind"] == "grid" else None)
    settings = meta.get("settings") or {k: v for k, v in meta.items() if k in V1_PRODUCER_KEYS}
    about = {k: meta[k] for k in ("weights", "layer") if k in meta}
    kept = {k: meta[k] for k in ("fingerprint", "capstack_version", "dataset", "image_root",
                                 "created", "count", "skipped", "shard") if k in meta}
    return {"format": FORMAT, **schema.to_meta(),
            "producer": {"name": meta.get("extractor", "unknown"), "settings": settings,
                         "about": about},
            **kept}
