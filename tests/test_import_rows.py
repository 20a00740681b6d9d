"""Importing other toolkits' files row by row: each test is the repro of one class of row a
hostile probe found, run as the user ran it. A record with no regions, a FIFO among the source
files, ViLBERT's layouts, an old store with an empty record; one malformed row, whatever the
malformation, is that row's bad row.
The random mutations of every format are in tests/test_import_fuzz.py."""

from __future__ import annotations

import io
import os
import pickle
import signal
import tracemalloc
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
from feature_sources import b64, butd_line, region_rows, write_butd_tsv

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.importer import ImportJob, import_features
from pipeline.features.stores import open_store


N = 6


IDS = list(range(100, 100 + N))


@pytest.fixture
def rows():
    return region_rows(IDS, dim=8, seed=3)


def stem(image_id: int) -> str:
    return f"COCO_val2014_{image_id:012d}"


def run(fmt, sources, dataset, tmp_path, **kw):
    job = ImportJob(fmt, [Path(s) for s in sources], dataset, root=tmp_path / "root",
                    dtype="float32", **kw)
    return open_store(import_features(job, progress=False).store)


def skipped(store) -> dict[int, str]:
    return {int(k): v for k, v in store.meta["skipped"].items()}


def write_rtl(base: Path, rows, feats=None):
    (base / "cocobu_att").mkdir(parents=True)
    for row in rows:
        feat = (feats or {}).get(row["image_id"], row["features"])
        np.savez(base / "cocobu_att" / f"{row['image_id']}.npz", feat=feat)
    return base / "cocobu_att"


def mmf_info(row) -> dict:
    return {"bbox": row["boxes"], "num_boxes": len(row["boxes"]), "objects": row["classes"],
            "cls_prob": np.stack([row["scores"], 1 - row["scores"]], 1).astype(np.float32),
            "image_width": row["image_w"], "image_height": row["image_h"]}


def write_mmf(folder: Path, rows, info_changes=None, features=None):
    folder.mkdir(parents=True)
    for row in rows:
        i = row["image_id"]
        np.save(folder / f"{stem(i)}.npy", (features or {}).get(i, row["features"]),
                allow_pickle=True)
        np.save(folder / f"{stem(i)}_info.npy", mmf_info(row) | (info_changes or {}).get(i, {}))
    return folder


def test_a_row_with_no_regions_is_a_bad_row_and_a_first_such_row_does_not_set_the_schema(
        coco, rows, tmp_path):
    att = write_rtl(tmp_path, rows, feats={101: np.zeros((0, 8), np.float32)})
    store = run("rtl-npz", [att], coco, tmp_path)
    assert "no regions (0 feature rows): nothing to caption from" in skipped(store)[101]
    assert len(store) == N - 1
    empty_first = dict(rows[0], boxes=np.zeros((0, 4), np.float32),
                       features=np.zeros((0, 8), np.float32))
    tsv = write_butd_tsv(tmp_path / "butd.tsv", [empty_first] + rows[1:])
    store = run("butd-tsv", [tsv], coco, tmp_path)
    assert store.feature_dim == 8 and len(store) == N - 1
    assert "no regions" in skipped(store)[100]


def test_an_old_store_with_an_empty_record_is_named_by_verify_and_by_training(
        coco, rows, tmp_path, monkeypatch):
    """A store written before capstack skipped them (the checks turned off to write one)."""
    from pipeline.features import catalog
    from pipeline.features.interchange import importer
    from pipeline.features.stores import base, schema
    from trainer.data import Features

    att = write_rtl(tmp_path, rows, feats={103: np.zeros((0, 8), np.float32)})
    with monkeypatch.context() as m:
        m.setattr(importer, "plausible", lambda record: record)
        m.setattr(base, "check_record", lambda s, i, record, where: record)
        store = run("rtl-npz", [att], coco, tmp_path)
    assert len(store) == N and store.get(103).num == 0
    with pytest.raises(CapstackError, match=r"image 103: a record with no regions \(0 rows\)"):
        catalog.check_every_record(store.path, progress=False)
    with pytest.raises(CapstackError, match=r"image 103: a record with no regions \(0 rows\), "
                                            r"nothing to attend to; `capstack verify --deep`"):
        Features([store.path]).read([102, 103])
    with pytest.raises(CapstackError, match="image 7: a record with no regions"):
        schema.check_record(store.schema, 7, schema.Record(np.zeros((0, 8)), 1, 1), "w")


@pytest.fixture
def watchdog():
    """Fails a test that blocks (a FIFO opened for reading waits for a writer forever)."""
    def expire(signum, frame):
        raise TimeoutError("blocked for 30 s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_fifo_among_the_source_files_is_a_bad_row_never_opened(coco, rows, tmp_path, watchdog):
    att = write_rtl(tmp_path, rows[:-1])
    os.mkfifo(att / f"{IDS[-1]}.npz")
    store = run("rtl-npz", [att], coco, tmp_path)
    assert "not a regular file (a FIFO), never read" in skipped(store)[IDS[-1]]
    folder = write_mmf(tmp_path / "mmf", rows[:-1])
    os.mkfifo(folder / f"{stem(IDS[-1])}.npy")
    (folder / f"{stem(IDS[0])}_info.npy").unlink()
    os.mkfifo(folder / f"{stem(IDS[0])}_info.npy")
    store = run("mmf-npy", [folder], coco, tmp_path)
    assert "not a regular file (a FIFO)" in skipped(store)[IDS[-1]]
    assert "not a regular file (a FIFO)" in skipped(store)[IDS[0]]
    os.mkfifo(tmp_path / "fifo.tsv")
    with pytest.raises(CapstackError, match=r"fifo.tsv: not a regular file \(a FIFO\): expected "
                                            r"a BUTD TSV"):
        run("butd-tsv", [tmp_path / "fifo.tsv"], coco, tmp_path)
    (tmp_path / "fifo.lmdb").mkdir()
    os.mkfifo(tmp_path / "fifo.lmdb" / "data.mdb")
    with pytest.raises(CapstackError, match=r"data.mdb: not a regular file: expected an LMDB"):
        run("mmf-lmdb", [tmp_path / "fifo.lmdb"], coco, tmp_path)


def test_mmf_npy_reads_vilberts_dict_per_image(coco, rows, tmp_path):
    folder = tmp_path / "vilbert"
    folder.mkdir()
    for row in rows:  # vilbert-multi-task script/extract_features.py: _save_feature
        info = mmf_info(row) | {"image_id": stem(row["image_id"]), "features": row["features"]}
        np.save(folder / f"{stem(row['image_id'])}.npy", info)
    store = run("mmf-npy", [folder], coco, tmp_path)
    assert len(store) == N
    for row in rows:
        record = store.get(row["image_id"])
        np.testing.assert_array_equal(record.features, row["features"])
        np.testing.assert_array_equal(record["boxes"], row["boxes"])
        np.testing.assert_array_equal(record["classes"], row["classes"])
        assert (record.height, record.width) == (row["image_h"], row["image_w"])


def test_mmf_lmdb_reads_vilberts_key_names(coco, rows, tmp_path):
    """ViLBERT's conversion names the info fields boxes, image_w, image_h."""
    path = tmp_path / "vilbert.lmdb"
    env = lmdb.open(str(path), map_size=1 << 24)
    keys = []
    with env.begin(write=True) as txn:
        for row in rows:
            key = stem(row["image_id"]).encode()
            item = {"image_id": key.decode(), "features": row["features"],
                    "boxes": row["boxes"], "num_boxes": len(row["boxes"]),
                    "image_w": row["image_w"], "image_h": row["image_h"]}
            txn.put(key, pickle.dumps(item))
            keys.append(key)
        txn.put(b"keys", pickle.dumps(keys))
    env.close()
    store = run("mmf-lmdb", [path], coco, tmp_path)
    for row in rows:
        record = store.get(row["image_id"])
        np.testing.assert_array_equal(record.features, row["features"])
        np.testing.assert_array_equal(record["boxes"], row["boxes"])
        assert (record.height, record.width) == (row["image_h"], row["image_w"])


def test_rtl_npz_reads_att_folders_of_npy_files(coco, rows, tmp_path):
    """An att folder of <id>.npy arrays (no npz) reads as the npz one does."""
    (tmp_path / "cocobu_att").mkdir()
    for row in rows:
        np.save(tmp_path / "cocobu_att" / f"{row['image_id']}.npy", row["features"])
    store = run("rtl-npz", [tmp_path / "cocobu_att"], coco, tmp_path)
    for row in rows:
        np.testing.assert_array_equal(store.get(row["image_id"]).features, row["features"])


@pytest.mark.parametrize("change, reason", [
    ({"image_height": "abc"}, "image_height 'abc' is not a whole number"),
    ({"image_height": float("nan")}, "image_height 'nan' is not a whole number"),
    ({"image_height": {"h": 3}}, "image_height \"{'h': 3}\" is not a whole number"),
    ({"image_width": -64}, "image width -64: expected 0 (unknown) to 1048576 pixels"),
    ({"cls_prob": np.zeros((3, 0), np.float32)}, "unreadable (ValueError: zero-size array"),
    ({"objects": np.array(["a", "b", "c"])}, "classes: values of dtype <U1 are not numbers"),
    ({"objects": np.full(3, 2 ** 40)}, "classes: 1099511627776 is beyond the int32 range"),
])
def test_a_malformed_mmf_info_is_that_rows_bad_row(coco, rows, tmp_path, change, reason):
    rows = [dict(r, boxes=r["boxes"][:3], features=r["features"][:3], classes=r["classes"][:3],
                 scores=r["scores"][:3]) for r in rows]
    store = run("mmf-npy", [write_mmf(tmp_path / "mmf", rows, {102: change})], coco, tmp_path)
    assert reason in skipped(store)[102]
    assert len(store) == N - 1


@pytest.mark.parametrize("feature, reason", [
    (np.array([["a", "b"], ["c", "d"]]), "features: values of dtype <U1 are not numbers"),
    (np.array([[{"x": 1}], [None]], dtype=object), "values of dtype object are not numbers"),
    (np.array([np.zeros(3), np.zeros(2)], dtype=object), "att feat of shape [2], expected [N, D]"),
    (np.ones((3, 8), np.complex64), "features: complex values (features are real numbers)"),
])
def test_features_of_strings_objects_ragged_or_complex_are_bad_rows(coco, rows, tmp_path,
                                                                    feature, reason):
    store = run("rtl-npz", [write_rtl(tmp_path / "rtl", rows, feats={104: feature})], coco,
                tmp_path)
    assert reason in skipped(store)[104]
    assert len(store) == N - 1


def test_m2_hdf5_links_groups_odd_dtypes_and_huge_declared_shapes_are_bad_rows(coco, rows,
                                                                                 tmp_path):
    path = tmp_path / "coco_detections.hdf5"
    with h5py.File(path, "w") as f:
        for row in rows:
            f[f"{row['image_id']}_features"] = row["features"]
            f[f"{row['image_id']}_boxes"] = row["boxes"]
        for i in (101, 102, 103, 104, 105):
            del f[f"{i}_features"]
        f.create_group("101_features")
        f["102_features"] = h5py.SoftLink("/100_features")
        f["103_features"] = h5py.ExternalLink("/etc/other.hdf5", "/x")
        f["104_features"] = np.zeros(3, np.dtype([("a", "f4"), ("b", "i4")]))
        f.create_dataset("105_features", shape=(10 ** 6, 10 ** 6), dtype=np.float32,
                         chunks=(1, 64))
    tracemalloc.start()
    try:
        store = run("m2-hdf5", [path], coco, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    reasons = skipped(store)
    assert "101_features: a group, expected a dataset" in reasons[101]
    assert "102_features: a SoftLink, not followed" in reasons[102]
    assert "103_features: a ExternalLink, not followed" in reasons[103]
    assert "104_features: values of dtype" in reasons[104]
    assert "105_features: declared shape [1000000, 1000000] would take 3,814,697 MiB" \
        in reasons[105]
    assert len(store) == 1 and peak < 16 << 20


def test_butd_sizes_beyond_any_image_and_non_ascii_digit_ids_are_bad_rows(coco, rows, tmp_path):
    huge = butd_line(rows[1]).replace(f"\t{rows[1]['image_w']}\t", f"\t{2 ** 70}\t", 1)
    negative = butd_line(rows[2]).replace(f"\t{rows[2]['image_w']}\t", "\t-64\t", 1)
    tsv = tmp_path / "butd.tsv"
    tsv.write_text(butd_line(rows[0]) + huge + negative + "\u00b2\t5\t5\t1\tAAAA\tAAAA\n"
                   + "".join(butd_line(r) for r in rows[3:]), encoding="utf-8")
    store = run("butd-tsv", [tsv], coco, tmp_path)
    reasons = skipped(store)
    assert f"image width {2 ** 70}: expected 0 (unknown) to 1048576 pixels" in reasons[101]
    assert "image width -64" in reasons[102]
    assert store.meta["import"]["unidentified_rows"] == 0 and len(store) == N - 2
    assert store.meta["import"]["outside_dataset"] == 1  # "²" names no image (no int("²"))


def test_a_vinvl_lineidx_of_text_is_named(coco, rows, tmp_path):
    tsv = tmp_path / "features.tsv"
    tsv.write_text(f"{IDS[0]}\t1\t{b64(np.zeros((1, 14), np.float32))}\n")
    (tmp_path / "features.lineidx").write_text("0\nabc\n")
    with pytest.raises(CapstackError, match=r"features.lineidx: not a VinVL .lineidx"):
        run("vinvl-tsv", [tsv], coco, tmp_path, image_root=tmp_path)


@pytest.mark.parametrize("method", [np.array([1, 2]), {"a": 1}, b"identity", ["identity"]])
def test_odd_lmdbdict_reserved_entries_are_named(coco, rows, tmp_path, method):
    path = tmp_path / "cocobu_att.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for row in rows:
            buffer = io.BytesIO()
            np.savez(buffer, feat=row["features"])
            txn.put(str(row["image_id"]).encode(), buffer.getvalue())
        txn.put(b"__value_dumps__", pickle.dumps(method))
        txn.put(b"__key_dumps__", pickle.dumps(method))
    env.close()
    with pytest.raises(CapstackError, match=r"cocobu_att.lmdb: lmdbdict values encoded with a "):
        run("rtl-lmdb", [path], coco, tmp_path)


def test_bua_npz_with_two_counts_is_a_bad_row(coco, rows, tmp_path):
    folder = tmp_path / "bua"
    folder.mkdir()
    for row in rows:
        n = len(row["boxes"]) if row["image_id"] != 103 else np.array([3, 3])
        np.savez(folder / stem(row["image_id"]), x=row["features"], bbox=row["boxes"],
                 num_bbox=n, image_h=row["image_h"], image_w=row["image_w"], info={})
    store = run("bua-npz", [folder], coco, tmp_path)
    assert "num_bbox '[3 3]' is not a whole number" in skipped(store)[103]
    assert len(store) == N - 1
