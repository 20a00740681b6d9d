"""Every importer against rows mutated at random, as a careless or hostile producer would write
them: values of the wrong type, shape, size or sign, keys missing, bytes flipped, files cut.

Each format's rows are written the way its producer writes them (``np.savez``,
``np.save`` of a dict, ``h5py``, a base64 TSV line, an lmdbdict entry), with
the first row left whole (the schema comes from it) and most others mutated.
The import must end, and every row must become either a record equal to its
source or a bad-row record in the store's ``skipped``: no exception escapes, and
nothing the files only declare (a 10^12-element shape, a 2**70-pixel image) is
allocated. Seeded: a failure names the seed, the format and the mutation.
"""

from __future__ import annotations

import io
import pickle
import tracemalloc
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
from feature_sources import b64, dataset_json, region_rows

from pipeline.features.interchange.importer import ImportJob, import_features
from pipeline.features.stores import open_store

N = 24
IDS = list(range(100, 100 + N))
DIM = 8
MAX_PEAK = 64 << 20  # bytes Python and numpy may hold at once while importing these rows


def stem(image_id: int) -> str:
    return f"COCO_val2014_{image_id:012d}"


# ----------------------------------------------------------------------------- mutations

def _n(value) -> int:
    return len(value) if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) else 3


VALUE_MUTATIONS = {
    "missing": lambda v, rng: MISSING,
    "string": lambda v, rng: np.array(["abc"] * _n(v)),
    "text": lambda v, rng: "abc",
    "object": lambda v, rng: np.array([{"a": 1}, None, "x"][:max(1, min(3, _n(v)))] * 1,
                                      dtype=object),
    "ragged": lambda v, rng: _ragged(v),
    "complex": lambda v, rng: np.asarray(v, np.float32).astype(np.complex64) * (1 + 1j),
    "nan": lambda v, rng: np.full(np.shape(v) or (3,), np.nan, np.float32),
    "huge int": lambda v, rng: np.full(np.shape(v) or (3,), 2 ** 40, np.int64),
    "2**70": lambda v, rng: 2 ** 70,
    "negative": lambda v, rng: -64 if np.ndim(v) == 0 else -np.abs(np.asarray(v)) - 1,
    "empty": lambda v, rng: np.asarray(v)[:0] if np.ndim(v) else np.zeros(0, np.float32),
    "no columns": lambda v, rng: np.zeros((_n(v), 0), np.float32),
    "flat": lambda v, rng: np.asarray(v).reshape(-1),
    "extra axis": lambda v, rng: np.asarray(v)[None],
    "scalar": lambda v, rng: np.float32(3.5),
    "none": lambda v, rng: None,
    "dict": lambda v, rng: {"a": np.zeros(2)},
    "float64": lambda v, rng: np.asarray(v, np.float64) if np.ndim(v) else 7.5,
    "two counts": lambda v, rng: np.array([3, 3]),
    "superscript": lambda v, rng: "\u00b2",
}
BYTE_MUTATIONS = ("flip", "truncate")
MISSING = object()


def _ragged(value):
    rows = max(2, _n(value))
    out = np.empty(rows, dtype=object)
    for k in range(rows):
        out[k] = np.zeros(k + 1, np.float32)
    return out


def plan(seed: int, keys: list[str]) -> dict[int, tuple[str, str]]:
    """Row index -> (what, key) for every row but the first: a value mutation of one key, a
    byte mutation of the row's bytes, or nothing (one row in four stays whole)."""
    rng = np.random.default_rng(seed)
    names = sorted(VALUE_MUTATIONS)
    out = {}
    for k in range(1, N):
        pick = rng.integers(0, 8)
        if pick < 2:
            continue
        if pick == 2:
            out[k] = (BYTE_MUTATIONS[int(rng.integers(0, 2))], "")
        else:
            out[k] = (names[int(rng.integers(0, len(names)))],
                      keys[int(rng.integers(0, len(keys)))])
    return out


def mutated(values: dict, mutation: tuple[str, str] | None, rng) -> dict:
    if mutation is None or mutation[0] in BYTE_MUTATIONS:
        return values
    name, key = mutation
    values = dict(values)
    new = VALUE_MUTATIONS[name](values.get(key, 0), rng)
    if new is MISSING:
        values.pop(key, None)
    else:
        values[key] = new
    return values


def damaged(data: bytes, mutation, rng) -> bytes:
    if mutation is None or mutation[0] not in BYTE_MUTATIONS or not data:
        return data
    if mutation[0] == "truncate":
        return data[:int(rng.integers(0, len(data)))]
    data = bytearray(data)
    for at in rng.integers(0, len(data), 1 + int(rng.integers(0, 8))):
        data[at] ^= 1 << int(rng.integers(0, 8))
    return bytes(data)


# ----------------------------------------------------------------------------- producers

def npz_bytes(values: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **{k: v for k, v in values.items()})
    return buffer.getvalue()


def npy_bytes(value) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=True)
    return buffer.getvalue()


def _write(path: Path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def rtl_values(row):
    return {"feat": row["features"], "box": row["boxes"]}


def write_rtl_npz(tmp, rows, mutations, rng):
    for k, row in enumerate(rows):
        values = mutated(rtl_values(row), mutations.get(k), rng)
        att = {key: v for key, v in values.items() if key == "feat"}
        _write(tmp / "cocobu_att" / f"{row['image_id']}.npz",
               damaged(npz_bytes(att), mutations.get(k), rng))
        if "box" in values:
            _write(tmp / "cocobu_box" / f"{row['image_id']}.npy", npy_bytes(values["box"]))
    return [tmp / "cocobu_att"]


def write_lmdbdict(path: Path, entries: dict[str, bytes]):
    env = lmdb.open(str(path), subdir=False, map_size=1 << 26, meminit=False)
    with env.begin(write=True) as txn:
        for key, value in entries.items():
            txn.put(key.encode(), value)
        txn.put(b"__keys__", pickle.dumps(list(entries)))
        txn.put(b"__value_dumps__", pickle.dumps("identity"))
    env.close()


def write_rtl_lmdb(tmp, rows, mutations, rng):
    att, box = {}, {}
    for k, row in enumerate(rows):
        values = mutated(rtl_values(row), mutations.get(k), rng)
        key = str(row["image_id"])
        att[key] = damaged(npz_bytes({k2: v for k2, v in values.items() if k2 == "feat"}),
                           mutations.get(k), rng)
        if "box" in values:
            box[key] = npy_bytes(values["box"])
    write_lmdbdict(tmp / "cocobu_att.lmdb", att)
    write_lmdbdict(tmp / "cocobu_box.lmdb", box)
    return [tmp / "cocobu_att.lmdb"]


def bua_values(row):
    n = len(row["boxes"])
    return {"x": row["features"], "bbox": row["boxes"], "num_bbox": n,
            "image_h": row["image_h"], "image_w": row["image_w"],
            "objects_id": row["classes"], "objects_conf": row["scores"].astype(np.float32)}


def write_bua_npz(tmp, rows, mutations, rng):
    for k, row in enumerate(rows):
        values = mutated(bua_values(row), mutations.get(k), rng)
        info = {key: values.pop(key) for key in ("objects_id", "objects_conf") if key in values}
        values["info"] = info
        _write(tmp / "bua" / f"{stem(row['image_id'])}.npz",
               damaged(npz_bytes(values), mutations.get(k), rng))
    return [tmp / "bua"]


def mmf_values(row):
    return {"features": row["features"], "bbox": row["boxes"], "num_boxes": len(row["boxes"]),
            "objects": row["classes"],
            "cls_prob": np.stack([row["scores"], row["scores"] / 2], 1).astype(np.float32),
            "image_width": row["image_w"], "image_height": row["image_h"]}


def write_mmf_npy(tmp, rows, mutations, rng):
    """extract_features_vmb.py: <stem>.npy (features) + <stem>_info.npy (np.save of a dict)."""
    for k, row in enumerate(rows):
        values = mutated(mmf_values(row), mutations.get(k), rng)
        features = values.pop("features", np.zeros((0, DIM), np.float32))
        _write(tmp / "mmf" / f"{stem(row['image_id'])}.npy",
               damaged(npy_bytes(features), mutations.get(k), rng))
        _write(tmp / "mmf" / f"{stem(row['image_id'])}_info.npy", npy_bytes(values))
    return [tmp / "mmf"]


def write_vilbert_npy(tmp, rows, mutations, rng):
    """vilbert-multi-task's extract_features.py: np.save(<stem>.npy, info | {features})."""
    for k, row in enumerate(rows):
        values = mutated(mmf_values(row), mutations.get(k), rng)
        _write(tmp / "vilbert" / f"{stem(row['image_id'])}.npy",
               damaged(npy_bytes(values), mutations.get(k), rng))
    return [tmp / "vilbert"]


def write_mmf_lmdb(tmp, rows, mutations, rng):
    env = lmdb.open(str(tmp / "mmf.lmdb"), map_size=1 << 26, meminit=False)
    keys = []
    with env.begin(write=True) as txn:
        for k, row in enumerate(rows):
            values = mutated(mmf_values(row), mutations.get(k), rng)
            key = f"val2014/{stem(row['image_id'])}".encode()
            txn.put(key, damaged(pickle.dumps(values), mutations.get(k), rng))
            keys.append(key)
        txn.put(b"keys", pickle.dumps(keys))
    env.close()
    return [tmp / "mmf.lmdb"]


def m2_values(row):
    n = len(row["boxes"])
    prob = np.random.default_rng(row["image_id"]).random((n, 5)).astype(np.float32)
    return {"features": row["features"], "boxes": row["boxes"], "cls_prob": prob}


def write_m2_hdf5(tmp, rows, mutations, rng):
    path = tmp / "coco_detections.hdf5"
    with h5py.File(path, "w") as f:
        for k, row in enumerate(rows):
            values = mutated(m2_values(row), mutations.get(k), rng)
            for key, value in values.items():
                _h5_put(f, f"{row['image_id']}_{key}", value)
            if mutations.get(k, ("",))[0] in BYTE_MUTATIONS:  # the HDF5 forms of damage
                name = f"{row['image_id']}_features"
                del f[name]
                if mutations[k][0] == "flip":
                    f[name] = h5py.SoftLink(f"/{rows[0]['image_id']}_features")
                else:
                    f[name] = h5py.ExternalLink("elsewhere.hdf5", "/x")
    return [path]


def _h5_put(f, name: str, value):
    """``value`` as h5py stores it: a dict as a group, text as a string dataset, a declared
    shape far beyond the data as an empty chunked dataset (nothing written)."""
    if value is None:
        return
    if isinstance(value, dict):
        f.create_group(name)
    elif isinstance(value, np.ndarray) and value.dtype.kind in "OU":
        f[name] = np.array([str(v) for v in value.ravel()], dtype=h5py.string_dtype())
    elif isinstance(value, int) and abs(value) > 2 ** 62:
        f.create_dataset(name, shape=(10 ** 6, 10 ** 6), dtype=np.float32, chunks=(1, 64))
    else:
        f[name] = value


def butd_values(row):
    return {"image_id": row["image_id"], "image_w": row["image_w"], "image_h": row["image_h"],
            "num_boxes": len(row["boxes"]), "boxes": row["boxes"], "features": row["features"]}


def _column(value) -> str:
    if isinstance(value, np.ndarray) and value.dtype != object and value.dtype.kind != "U":
        return b64(value)
    return str(value).replace("\t", " ").replace("\n", " ")


def write_tsv(path: Path, lines: list[bytes]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))


def write_butd_tsv(tmp, rows, mutations, rng):
    lines = []
    for k, row in enumerate(rows):
        values = mutated(butd_values(row), mutations.get(k), rng)
        text = "\t".join(_column(values[c]) for c in butd_values(row) if c in values)
        lines.append(damaged(text.encode(), mutations.get(k), rng).replace(b"\n", b" ") + b"\n")
    write_tsv(tmp / "butd.tsv", lines)
    return [tmp / "butd.tsv"]


def vinvl_values(row):
    h, w = row["image_h"], row["image_w"]
    x1, y1, x2, y2 = row["boxes"].T
    geometry = np.stack([x1 / w, y1 / h, x2 / w, y2 / h, (x2 - x1) / w, (y2 - y1) / h], 1)
    return {"image_id": row["image_id"], "num_boxes": len(row["boxes"]),
            "features": np.concatenate([row["features"], geometry], 1).astype(np.float32)}


def write_vinvl_tsv(tmp, rows, mutations, rng):
    lines = []
    for k, row in enumerate(rows):
        values = mutated(vinvl_values(row), mutations.get(k), rng)
        text = "\t".join(_column(values[c]) for c in vinvl_values(row) if c in values)
        lines.append(damaged(text.encode(), mutations.get(k), rng).replace(b"\n", b" ") + b"\n")
    write_tsv(tmp / "features.tsv", lines)
    offsets = np.cumsum([0] + [len(line) for line in lines[:-1]])
    (tmp / "features.lineidx").write_text("".join(f"{o}\n" for o in offsets))
    _images(tmp / "images", rows)
    return [tmp / "features.tsv"]


def _images(root: Path, rows):
    from PIL import Image

    (root / "val2014").mkdir(parents=True)
    for row in rows:
        Image.new("RGB", (row["image_w"], row["image_h"])).save(
            root / "val2014" / f"{stem(row['image_id'])}.jpg")


# format -> (writer, the keys a value mutation may hit, the import's own name, extra job args)
FORMATS = {
    "rtl-npz": (write_rtl_npz, ["feat", "box"], {}),
    "rtl-lmdb": (write_rtl_lmdb, ["feat", "box"], {}),
    "bua-npz": (write_bua_npz, ["x", "bbox", "num_bbox", "image_h", "image_w", "objects_id",
                                "objects_conf"], {}),
    "mmf-npy": (write_mmf_npy, ["features", "bbox", "objects", "cls_prob", "image_width",
                                "image_height"], {}),
    "mmf-npy:vilbert": (write_vilbert_npy, ["features", "bbox", "objects", "cls_prob",
                                            "image_width", "image_height"], {}),
    "mmf-lmdb": (write_mmf_lmdb, ["features", "bbox", "objects", "cls_prob", "image_width",
                                  "image_height"], {}),
    "m2-hdf5": (write_m2_hdf5, ["features", "boxes", "cls_prob"], {}),
    "butd-tsv": (write_butd_tsv, ["image_id", "image_w", "image_h", "num_boxes", "boxes",
                                  "features"], {}),
    "vinvl-tsv": (write_vinvl_tsv, ["image_id", "num_boxes", "features"], {"image_root": True}),
}
TOTALS = {"rows": 0, "bad": 0, "imported": 0, "tracebacks": 0}


@pytest.mark.filterwarnings("error")  # a cast that loses values only warns: none may happen
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_mutated_row_is_a_record_equal_to_its_source_or_a_bad_row(name, seed, tmp_path):
    writer, keys, extra = FORMATS[name]
    rows = region_rows(IDS, dim=DIM, seed=seed, boxes=(2, 6))
    mutations = plan(seed * 100 + sorted(FORMATS).index(name), keys)
    rng = np.random.default_rng(seed)
    sources = writer(tmp_path, rows, mutations, rng)
    dataset = dataset_json(tmp_path / "dataset_coco.json", N)
    job = ImportJob(name.split(":")[0], sources, dataset, root=tmp_path / "root",
                    dtype="float32",
                    image_root=tmp_path / "images" if extra.get("image_root") else None)
    tracemalloc.start()
    try:
        result = import_features(job, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    store = open_store(result.store)
    skipped = store.meta["skipped"]
    stored = set(int(i) for i in store.ids())
    for k, row in enumerate(rows):
        image_id, mutation = row["image_id"], mutations.get(k)
        where = f"seed {seed}, {name}, row {k} ({mutation})"
        assert (image_id in stored) != (str(image_id) in skipped), where
        if image_id in stored:
            record = store.get(image_id)
            assert record.num >= 1 and np.isfinite(record.features).all(), where
            if mutation is None:
                np.testing.assert_array_equal(record.features, row["features"], err_msg=where)
    assert peak < MAX_PEAK, f"{name}: {peak / 2**20:.0f} MiB held at once"
    untouched = [k for k in range(N) if k not in mutations]
    assert all(rows[k]["image_id"] in stored for k in untouched)
    TOTALS["rows"] += N
    TOTALS["bad"] += len(skipped)
    TOTALS["imported"] += len(stored)
    print(f"\n{name} seed {seed}: {N} rows tried, {len(stored)} imported, {len(skipped)} bad "
          f"rows recorded, 0 tracebacks (peak {peak / 2**20:.1f} MiB)")
