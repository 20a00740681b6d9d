"""Every other import format, from fixtures written here in the producer's published layout:
the imported records equal the written arrays, broken rows are skipped with the reason, and
nothing a file holds is ever run."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
from feature_sources import b64, region_rows
from PIL import Image

from pipeline.core.errors import CapstackError
from pipeline.core.safe_pickle import RefusedPickle
from pipeline.features.interchange.importer import ImportJob, import_features
from pipeline.features.stores import open_store

N = 10
IDS = list(range(100, 100 + N))


@pytest.fixture
def rows():
    return region_rows(IDS, dim=24, seed=5)


def stem(image_id: int) -> str:
    return f"COCO_val2014_{image_id:012d}"


def run(fmt, sources, dataset, tmp_path, **kw):
    job = ImportJob(fmt, [Path(s) for s in sources], dataset, root=tmp_path / "root",
                    dtype="float32", **kw)
    result = import_features(job, progress=False)
    return open_store(result.store), result


def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def npy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


# ----------------------------------------------------------------- self-critical.pytorch

def write_rtl_folders(base: Path, rows, feature_key="feat"):
    """make_bu_data.py: <base>_att/<id>.npz (feat), <base>_fc/<id>.npy, <base>_box/<id>.npy."""
    for suffix in ("_att", "_fc", "_box"):
        base.with_name(base.name + suffix).mkdir(parents=True)
    for row in rows:
        name = str(row["image_id"])
        np.savez_compressed(base.with_name(base.name + "_att") / name,
                            **{feature_key: row["features"]})
        np.save(base.with_name(base.name + "_fc") / name, row["features"].mean(0))
        np.save(base.with_name(base.name + "_box") / name, row["boxes"])


def test_rtl_npz_regions_and_a_broken_file(coco, rows, tmp_path):
    base = tmp_path / "cocobu"
    write_rtl_folders(base, rows)
    (tmp_path / "cocobu_att" / "103.npz").write_bytes(b"PK\x03\x04 not a zip")
    (tmp_path / "cocobu_box" / "105.npy").unlink()
    store, result = run("rtl-npz", [base], coco, tmp_path)
    assert store.schema.names == ("features", "boxes") and store.schema.grid is None
    assert len(store) == N - 2 and result.report.bad_rows == 2
    assert "not an .npz archive" in store.meta["skipped"]["103"]
    assert "no box file" in store.meta["skipped"]["105"]
    for row in rows:
        if row["image_id"] not in (103, 105):
            record = store.get(row["image_id"])
            np.testing.assert_array_equal(record.features, row["features"])
            np.testing.assert_array_equal(record["boxes"], row["boxes"])
            assert (record.height, record.width) == (0, 0)  # the layout records no size
    assert store.meta["image_size_known"] is False


def test_rtl_npz_grid_files_become_a_grid_store(coco, tmp_path):
    att = tmp_path / "cocotalk_att"
    att.mkdir()
    rng = np.random.default_rng(0)
    grids = {i: rng.random((4, 4, 16), dtype=np.float32) for i in IDS}
    for i, grid in grids.items():
        np.savez_compressed(att / str(i), z=grid)  # cocotest_bu's key
    store, _ = run("rtl-npz", [att], coco, tmp_path)
    assert store.schema.grid == 4 and store.path.name.startswith("grid-rtl-npz-")
    np.testing.assert_array_equal(store.get(104).features, grids[104].reshape(16, 16))


def write_lmdbdict(path: Path, values: dict[str, bytes]):
    """lmdbdict (key_method ascii, value_method identity): one file, reserved pickled entries."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key.encode("ascii"), value)
        txn.put(b"__keys__", pickle.dumps(set(values)))
        for name, method in (("key_dumps", "ascii"), ("key_loads", "ascii"),
                             ("value_dumps", "identity"), ("value_loads", "identity")):
            txn.put(f"__{name}__".encode(), pickle.dumps(method))
    env.close()


def test_rtl_lmdb_with_its_box_lmdb(coco, rows, tmp_path):
    write_lmdbdict(tmp_path / "cocobu_att.lmdb",
                   {str(r["image_id"]): npz_bytes(feat=r["features"]) for r in rows})
    write_lmdbdict(tmp_path / "cocobu_box.lmdb",
                   {str(r["image_id"]): npy_bytes(r["boxes"]) for r in rows[:-1]})
    store, result = run("rtl-lmdb", [tmp_path / "cocobu_att.lmdb"], coco, tmp_path)
    assert len(store) == N - 1 and "no entry '109'" in store.meta["skipped"]["109"]
    for row in rows[:-1]:
        np.testing.assert_array_equal(store.get(row["image_id"]).features, row["features"])
        np.testing.assert_array_equal(store.get(row["image_id"])["boxes"], row["boxes"])
    assert store.meta["producer"]["about"]["source_producer"]["value_dumps"] == "identity"


# ----------------------------------------------------------------- MILVLG

def write_bua(folder: Path, rows, *, transposed=()):
    folder.mkdir()
    for row in rows:
        n = len(row["boxes"])
        info = {"image_id": stem(row["image_id"]), "image_h": row["image_h"],
                "image_w": row["image_w"], "num_boxes": n,
                "objects_id": row["classes"], "objects_conf": row["scores"].astype(np.float32),
                "attrs_id": row["attributes"],
                "attrs_conf": row["attribute_scores"].astype(np.float32)}
        x = row["features"].T if row["image_id"] in transposed else row["features"]
        np.savez_compressed(folder / stem(row["image_id"]), x=x, bbox=row["boxes"],
                            num_bbox=n, image_h=row["image_h"], image_w=row["image_w"],
                            info=info)


def test_bua_npz_keeps_classes_attributes_and_sizes(coco, rows, tmp_path):
    write_bua(tmp_path / "bua", rows, transposed={101})
    bad = dict(np.load(tmp_path / "bua" / f"{stem(102)}.npz", allow_pickle=True))
    bad["num_bbox"] = np.int64(99)
    np.savez_compressed(tmp_path / "bua" / stem(102), **bad)
    store, result = run("bua-npz", [tmp_path / "bua"], coco, tmp_path)
    assert store.schema.names == ("features", "boxes", "classes", "scores", "attributes",
                                  "attribute_scores")
    assert "num_bbox 99 disagrees" in store.meta["skipped"]["102"]
    for row in rows:
        if row["image_id"] == 102:
            continue
        record = store.get(row["image_id"])
        np.testing.assert_array_equal(record.features, row["features"])
        np.testing.assert_array_equal(record["classes"], row["classes"])
        np.testing.assert_array_equal(record["attributes"], row["attributes"])
        np.testing.assert_allclose(record["scores"], row["scores"], rtol=1e-6)
        assert (record.height, record.width) == (row["image_h"], row["image_w"])
    assert store.meta["image_size_known"] is True


class RunsACommand:
    """What a malicious feature file would pickle: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_a_command_is_refused_and_nothing_runs(coco, rows, tmp_path):
    write_bua(tmp_path / "bua", rows[:3])
    marker = tmp_path / "ran"
    evil = tmp_path / "bua" / f"{stem(100)}.npz"
    arrays = dict(np.load(evil, allow_pickle=True))
    arrays["info"] = np.array({"objects_id": RunsACommand(marker)}, dtype=object)
    np.savez_compressed(evil, **arrays)
    with pytest.raises(RefusedPickle, match=rf"{evil}\[info\]: refusing to unpickle "
                                            rf"(posix|os|nt)\.system"):
        run("bua-npz", [tmp_path / "bua"], coco, tmp_path)
    assert not marker.exists()
    assert not any((tmp_path / "root").glob("regions-*"))


# ----------------------------------------------------------------- meshed-memory

def test_m2_hdf5_classes_from_cls_prob(coco, rows, tmp_path):
    path = tmp_path / "coco_detections.hdf5"
    rng = np.random.default_rng(1)
    probs = {}
    with h5py.File(path, "w") as f:
        for row in rows:
            i, n = row["image_id"], len(row["boxes"])
            f[f"{i}_features"] = row["features"]
            f[f"{i}_boxes"] = row["boxes"] if i != 107 else row["boxes"][:1]
            probs[i] = rng.random((n, 11)).astype(np.float32)
            f[f"{i}_cls_prob"] = probs[i]
    store, _ = run("m2-hdf5", [path], coco, tmp_path)
    assert "107_boxes of shape [1, 4]" in store.meta["skipped"]["107"]
    record = store.get(104)
    np.testing.assert_array_equal(record.features, rows[4]["features"])
    np.testing.assert_array_equal(record["boxes"], rows[4]["boxes"])
    np.testing.assert_array_equal(record["classes"], probs[104][:, 1:].argmax(1) + 1)
    np.testing.assert_array_equal(record["scores"], probs[104][:, 1:].max(1))


# ----------------------------------------------------------------- VinVL

def write_images(root: Path, dataset_ids, size=(96, 128)):
    (root / "val2014").mkdir(parents=True)
    for i in dataset_ids:
        Image.new("RGB", (size[1], size[0])).save(root / "val2014" / f"{stem(i)}.jpg")


def test_vinvl_tsv_geometry_columns_become_pixel_boxes(coco, rows, tmp_path):
    tsv, offsets = tmp_path / "features.tsv", []
    with open(tsv, "w") as f:
        for row in rows:
            h, w = row["image_h"], row["image_w"]
            x1, y1, x2, y2 = row["boxes"].T
            geometry = np.stack([x1 / w, y1 / h, x2 / w, y2 / h, (x2 - x1) / w, (y2 - y1) / h], 1)
            packed = np.concatenate([row["features"], geometry], 1).astype(np.float32)
            offsets.append(f.tell())
            f.write(f"{row['image_id']}\t{len(packed)}\t{b64(packed)}\n")
    (tmp_path / "features.lineidx").write_text("".join(f"{o}\n" for o in offsets))
    with pytest.raises(CapstackError, match="--image-root"):
        run("vinvl-tsv", [tsv], coco, tmp_path)
    write_images(tmp_path / "images", IDS)
    store, _ = run("vinvl-tsv", [tsv], coco, tmp_path, image_root=tmp_path / "images")
    for row in rows:
        record = store.get(row["image_id"])
        np.testing.assert_array_equal(record.features, row["features"])
        np.testing.assert_allclose(record["boxes"], row["boxes"], rtol=1e-5, atol=1e-4)
        assert (record.height, record.width) == (row["image_h"], row["image_w"])
    about = store.meta["producer"]["about"]
    assert about["boxes_converted_from"].startswith("x1/w, y1/h, x2/w, y2/h")
    assert about["boxes"] == "x1, y1, x2, y2 in image pixels"


# ----------------------------------------------------------------- MMF

def mmf_info(row) -> dict:
    return {"bbox": row["boxes"], "num_boxes": len(row["boxes"]), "objects": row["classes"],
            "cls_prob": np.stack([row["scores"], row["scores"] / 2], 1).astype(np.float32),
            "image_width": row["image_w"], "image_height": row["image_h"]}


def test_mmf_npy_folder(coco, rows, tmp_path):
    folder = tmp_path / "mmf"
    folder.mkdir()
    for row in rows:
        np.save(folder / f"{stem(row['image_id'])}.npy", row["features"])
        np.save(folder / f"{stem(row['image_id'])}_info.npy", mmf_info(row) if
                row["image_id"] != 108 else dict(mmf_info(row), objects=row["classes"][:1]))
    store, _ = run("mmf-npy", [folder], coco, tmp_path)
    assert "objects of shape [1]" in store.meta["skipped"]["108"]
    record = store.get(106)
    np.testing.assert_array_equal(record.features, rows[6]["features"])
    np.testing.assert_array_equal(record["classes"], rows[6]["classes"])
    np.testing.assert_allclose(record["scores"], rows[6]["scores"], rtol=1e-6)
    assert (record.height, record.width) == (rows[6]["image_h"], rows[6]["image_w"])


def test_mmf_lmdb(coco, rows, tmp_path):
    path = tmp_path / "coco_trainval.lmdb"
    env = lmdb.open(str(path), map_size=1 << 30)  # lmdb_conversion.py: a folder environment
    keys = []
    with env.begin(write=True) as txn:
        for row in rows:
            key = f"val2014/{stem(row['image_id'])}".encode()
            item = {"feature_path": key.decode(), "features": row["features"], **mmf_info(row)}
            txn.put(key, pickle.dumps(item) if row["image_id"] != 101 else b"garbage")
            keys.append(key)
        txn.put(b"keys", pickle.dumps(keys))
    env.close()
    store, _ = run("mmf-lmdb", [path], coco, tmp_path)
    assert len(store) == N - 1 and "unreadable pickle" in store.meta["skipped"]["101"]
    np.testing.assert_array_equal(store.get(109).features, rows[9]["features"])
    np.testing.assert_array_equal(store.get(109)["boxes"], rows[9]["boxes"])
