"""Feature stores: real LMDB and HDF5 files written, reopened, read by several processes."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.core.errors import CapstackError
from pipeline.features.stores import (Record, Schema, create_writer, field, open_store,
                                      partial_path, store_format)
from pipeline.features.stores.buffer import BatchBuffer

SUFFIXES = [".lmdb", ".h5"]


def meta(kind="regions", dim=8, dtype="float16", grid=None, **extra):
    """A store's metadata: region records (features, boxes, scores, classes) or grid ones."""
    fields = [field("features", (dim,), dtype)]
    if kind == "regions":
        fields += [field("boxes", (4,), "float32"), field("scores", (), "float32"),
                   field("classes", (), "int32")]
    return {**Schema(tuple(fields), grid).to_meta(),
            "producer": {"name": "test", "settings": {}, "about": {}},
            "fingerprint": "f00d", "capstack_version": "test"} | extra


def region_record(rng, n, dim=8):
    return Record(rng.standard_normal((n, dim)).astype(np.float32), height=60 + n, width=80,
                  boxes=rng.uniform(0, 50, (n, 4)).astype(np.float32),
                  scores=rng.uniform(size=n).astype(np.float32),
                  classes=rng.integers(0, 9, n).astype(np.int32))


def write_store(path, n_images=12, kind="regions", skip=(), **meta_extra):
    rng = np.random.default_rng(0)
    records = {}
    with create_writer(path, meta(kind, **meta_extra)) as writer:
        for start in range(0, n_images, 5):
            batch = []
            for i in range(start, min(start + 5, n_images)):
                if i in skip:
                    continue
                rec = region_record(rng, 1 + i % 7) if kind == "regions" else Record(
                    rng.standard_normal((4, 8)).astype(np.float32), 32, 32)
                records[100 + i] = rec
                batch.append((100 + i, rec))
            writer.write(batch, [(100 + i, "not an image") for i in skip
                                 if start <= i < start + 5])
        writer.finish()
    return records


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_write_reopen_read(tmp_path, suffix):
    path = tmp_path / f"store{suffix}"
    records = write_store(path, skip=(3,))
    assert not partial_path(path).exists()
    store = open_store(path)
    assert len(store) == 11 and 103 not in store and 104 in store
    assert store.meta["count"] == 11 and store.meta["skipped"] == {"103": "not an image"}
    assert sorted(store.ids()) == sorted(records)
    for image_id, rec in records.items():
        got = store.get(image_id)
        np.testing.assert_array_equal(got.features, rec.features.astype(np.float16))
        assert got.features.dtype == np.float16
        np.testing.assert_array_equal(got["boxes"], rec["boxes"])
        np.testing.assert_array_equal(got["scores"], rec["scores"])
        np.testing.assert_array_equal(got["classes"], rec["classes"])
        assert (got.height, got.width) == (rec.height, rec.width)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_read_batch_pads_and_masks(tmp_path, suffix):
    path = tmp_path / f"store{suffix}"
    records = write_store(path)
    ids = [106, 100, 105]
    batch = open_store(path).read_batch(ids, fields=("boxes",))
    assert batch.features.shape == (3, 7, 8) and batch.features.dtype == np.float16
    assert set(batch.fields) == {"boxes"} and not open_store(path).read_batch(ids).fields
    assert batch.mask.sum(axis=1).tolist() == [7, 1, 6]
    for k, i in enumerate(ids):
        n = records[i].num
        np.testing.assert_array_equal(batch.features[k, :n], records[i].features.astype(np.float16))
        assert not batch.features[k, n:].any()
        np.testing.assert_array_equal(batch.fields["boxes"][k, :n], records[i]["boxes"])
        assert not batch.fields["boxes"][k, n:].any()
        assert batch.hw[k].tolist() == [records[i].height, records[i].width]
    capped = open_store(path).read_batch(ids, max_rows=3)
    assert capped.features.shape == (3, 3, 8) and capped.mask.sum() == 7


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_batch_buffer_is_reused_and_grows(tmp_path, suffix):
    path = tmp_path / f"store{suffix}"
    write_store(path)
    store, buffer = open_store(path), BatchBuffer()
    small = store.read_batch([100, 101], allocate=buffer)
    np.testing.assert_array_equal(small.features, store.read_batch([100, 101]).features)
    small_address = small.features.ctypes.data
    big_ids = [106, 100, 105, 104]
    big = store.read_batch(big_ids, allocate=buffer)  # larger: the buffer grows
    np.testing.assert_array_equal(big.features, store.read_batch(big_ids).features)
    again = store.read_batch([101, 102], allocate=buffer)  # smaller: the same memory again
    assert again.features.ctypes.data == big.features.ctypes.data != small_address
    np.testing.assert_array_equal(again.features, store.read_batch([101, 102]).features)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_grid_store_and_float32(tmp_path, suffix):
    path = tmp_path / f"grid{suffix}"
    write_store(path, kind="grid", dtype="float32", grid=2)
    store = open_store(path)
    assert store.schema.grid == 2 and store.get(100).features.dtype == np.float32
    assert store.get(100).get("boxes") is None and store.schema.names == ("features",)
    with pytest.raises(CapstackError, match="no field 'boxes' to read"):
        store.read_batch([100], fields=("boxes",))


def _checksum(path, ids):
    store = open_store(path)
    return float(sum(np.abs(store.get(i).features.astype(np.float64)).sum() for i in ids))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_concurrent_reader_processes(tmp_path, suffix):
    path = tmp_path / f"store{suffix}"
    records = write_store(path)
    expected = _checksum(path, list(records))
    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.starmap(_checksum, [(path, list(records))] * 3)
    assert results == [expected] * 3


class StoreDataset(Dataset):
    def __init__(self, store, ids):
        self.store, self.ids = store, ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, k):
        return torch.from_numpy(self.store.get(self.ids[k]).features[:1].copy())


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_dataloader_workers_return_the_same_arrays(tmp_path, suffix, context):
    path = tmp_path / f"store{suffix}"
    records = write_store(path)
    store = open_store(path)
    store.get(100)  # the parent has the backend open before the workers start
    ids = sorted(records)
    serial = [b for b in DataLoader(StoreDataset(store, ids), batch_size=4)]
    parallel = [b for b in DataLoader(StoreDataset(store, ids), batch_size=4, num_workers=2,
                                      multiprocessing_context=context)]
    assert len(serial) == len(parallel)
    for a, b in zip(serial, parallel):
        assert torch.equal(a, b)
    store.get(101)  # and the parent still reads


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_non_finite_features_are_refused_naming_the_image(tmp_path, suffix):
    path = tmp_path / f"store{suffix}"
    writer = create_writer(path, meta("grid", dim=2))
    ok = Record(np.ones((4, 2), np.float32), 10, 10)
    writer.write([(1, ok)])
    huge = Record(np.full((4, 2), 4e5, np.float32), 10, 10)
    with pytest.raises(CapstackError, match=r"image 7: non-finite feature values .*4e\+05 "
                                            r"overflows float16"):
        writer.write([(2, ok), (7, huge)])
    assert writer.done == {1}  # the whole batch was refused
    writer.close()


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_interrupted_writer_resumes_without_duplicates(tmp_path, suffix):
    path = tmp_path / f"store{suffix}"
    rng = np.random.default_rng(1)
    recs = {i: region_record(rng, 3) for i in range(6)}
    first = create_writer(path, meta())
    first.write([(i, recs[i]) for i in range(3)], [(50, "missing file")])
    first.close()  # stopped before finish
    with pytest.raises(CapstackError, match="still being written"):
        open_store(path)
    second = create_writer(path, meta())
    assert second.done == {0, 1, 2, 50}
    second.write([(i, recs[i]) for i in range(1, 6)])  # 1 and 2 again: ignored
    second.finish()
    store = open_store(path)
    assert sorted(store.ids()) == list(range(6)) and store.meta["skipped"] == {"50": "missing file"}
    other = create_writer(tmp_path / f"other{suffix}", meta())
    other.close()
    with pytest.raises(CapstackError, match="made with other settings"):
        create_writer(tmp_path / f"other{suffix}", meta() | {"fingerprint": "beef"})


def test_reader_refuses_bad_stores(tmp_path):
    import lmdb

    empty = tmp_path / "empty.lmdb"
    lmdb.open(str(empty)).close()
    with pytest.raises(CapstackError, match="not a capstack feature store"):
        open_store(empty)
    path = tmp_path / "lying.lmdb"
    write_store(path)
    env = lmdb.open(str(path))
    with env.begin(write=True) as txn:
        m = json.loads(txn.get(b"__meta__"))
        txn.put(b"__meta__", json.dumps(m | {"count": 99}).encode())
    env.close()
    with pytest.raises(CapstackError, match="metadata says 99 records, the store holds 12"):
        open_store(path)
    with pytest.raises(CapstackError, match="feature store not found"):
        open_store(tmp_path / "nothing.h5")


def test_format_from_suffix_or_flag(tmp_path):
    assert store_format("a/b.lmdb") == "lmdb" and store_format("x.h5") == "hdf5"
    assert store_format("x.bin", "hdf5") == "hdf5"
    with pytest.raises(CapstackError, match="cannot tell the store format"):
        store_format(tmp_path / "features.bin")


V1 = Path(__file__).parent / "data" / "stores_v1"


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_stores_written_before_fields_were_declared_keep_reading(suffix):
    """tests/data/stores_v1: stores as 0.1.0 wrote them (kind, the settings twice). Today's
    readers see their fields, grid and producer, and the same records."""
    expected = np.load(V1 / "expected.npz")
    grid = open_store(V1 / f"grid{suffix}")
    assert grid.meta["fields"] == {"features": {"shape": ["N", 8], "dtype": "float16"}}
    assert grid.schema.grid == 2 and grid.meta["skipped"] == {"9": "not an image"}
    assert grid.meta["producer"]["name"] == "extract-grid"
    assert grid.meta["producer"]["settings"]["image_size"] == 64  # what captioning reruns
    assert grid.meta["producer"]["about"]["weights"] == "random"
    assert grid.meta["fingerprint"] == "a1b2c3d4e5f60718" and "kind" not in grid.meta
    for i in (1, 2, 3):
        record = grid.get(i)
        np.testing.assert_array_equal(record.features, expected[f"grid_{i}_features"])
        assert [record.height, record.width] == expected[f"grid_{i}_hw"].tolist()
    regions = open_store(V1 / f"regions{suffix}")
    assert regions.schema.names == ("features", "boxes", "scores", "classes")
    assert regions.schema.grid is None
    assert regions.meta["producer"]["settings"]["boxes"] == "given"
    for i in (1, 2, 3):
        record = regions.get(i)
        for name in regions.schema.names:
            np.testing.assert_array_equal(record[name], expected[f"regions_{i}_{name}"])
    batch = regions.read_batch([3, 1], fields=("boxes", "classes"))
    np.testing.assert_array_equal(batch.fields["boxes"][1, :2], expected["regions_1_boxes"])
    np.testing.assert_array_equal(batch.fields["classes"][0], expected["regions_3_classes"])


ATTRIBUTES = Schema((field("features", (6,), "float16"), field("boxes", (4,), "float32"),
                     field("attr_ids", (3,), "int32"), field("attr_scores", (3,), "float32")))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_store_holds_whatever_fields_its_metadata_declares(tmp_path, suffix):
    """Attribute ids and scores per box (the Visual Genome detector's), written and read back
    by both backends without either knowing what they are."""
    rng = np.random.default_rng(3)
    records = {i: Record(rng.standard_normal((n, 6)).astype(np.float32), 40, 50,
                         boxes=rng.uniform(0, 40, (n, 4)).astype(np.float32),
                         attr_ids=rng.integers(0, 400, (n, 3)).astype(np.int32),
                         attr_scores=rng.uniform(size=(n, 3)).astype(np.float32))
               for i, n in ((5, 2), (6, 4), (7, 1))}
    path = tmp_path / f"attributes{suffix}"
    with create_writer(path, {**ATTRIBUTES.to_meta(), "fingerprint": "a77",
                              "producer": {"name": "import-test", "settings": {}, "about": {}},
                              "capstack_version": "test"}) as writer:
        writer.write(list(records.items()))
        writer.finish()
    store = open_store(path)
    assert store.schema == ATTRIBUTES
    for i, rec in records.items():
        got = store.get(i)
        for name in ATTRIBUTES.names[1:]:
            np.testing.assert_array_equal(got[name], rec[name])
    batch = store.read_batch([6, 7], fields=("attr_ids", "attr_scores"))
    assert (batch.fields["attr_ids"].shape == (2, 4, 3)
            and batch.fields["attr_ids"].dtype == np.int32)
    np.testing.assert_array_equal(batch.fields["attr_ids"][1, :1], records[7]["attr_ids"])
    assert not batch.fields["attr_ids"][1, 1:].any()
    np.testing.assert_array_equal(batch.fields["attr_scores"][0], records[6]["attr_scores"])


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_records_must_match_the_declared_fields(tmp_path, suffix):
    writer = create_writer(tmp_path / f"s{suffix}", meta("regions", dim=2))
    feats = np.ones((2, 2), np.float32)
    with pytest.raises(CapstackError, match=r"image 4: record without scores"):
        writer.write([(4, Record(feats, 9, 9, boxes=np.zeros((2, 4)), classes=np.zeros(2)))])
    with pytest.raises(CapstackError, match=r"image 5: field 'attr_ids' is not declared in the "
                                            r"store's metadata \(fields: features, boxes"):
        writer.write([(5, Record(feats, 9, 9, boxes=np.zeros((2, 4)), scores=np.zeros(2),
                                 classes=np.zeros(2), attr_ids=np.zeros((2, 3))))])
    with pytest.raises(CapstackError, match=r"image 6: boxes of shape \(3, 4\), expected \[2, 4\]"):
        writer.write([(6, Record(feats, 9, 9, boxes=np.zeros((3, 4)), scores=np.zeros(2),
                                 classes=np.zeros(2)))])
    assert writer.done == set()
    writer.close()
    with pytest.raises(CapstackError, match=r"fields.features: expected shape \[N, D\]"):
        create_writer(tmp_path / f"t{suffix}", {**meta(), "fields": {
            "features": {"shape": ["N", 2, 2], "dtype": "float16"}}})
