"""Feature stores: real LMDB and HDF5 files written, reopened, read by several processes."""

from __future__ import annotations

import json
import multiprocessing as mp

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.core.errors import CapstackError
from pipeline.features.stores import Record, create_writer, open_store, partial_path, store_format
from pipeline.features.stores.buffer import BatchBuffer

SUFFIXES = [".lmdb", ".h5"]


def meta(kind="regions", dim=8, dtype="float16", **extra):
    base = {"kind": kind, "extractor": "test", "backbone": "none", "weights": "random",
            "weights_md5": "random", "feature_dim": dim, "dtype": dtype,
            "fingerprint": "f00d", "capstack_version": "test"}
    return base | extra


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
        np.testing.assert_array_equal(got.boxes, rec.boxes)
        np.testing.assert_array_equal(got.scores, rec.scores)
        np.testing.assert_array_equal(got.classes, rec.classes)
        assert (got.height, got.width) == (rec.height, rec.width)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_read_batch_pads_and_masks(tmp_path, suffix):
    path = tmp_path / f"store{suffix}"
    records = write_store(path)
    ids = [106, 100, 105]
    batch = open_store(path).read_batch(ids)
    assert batch.features.shape == (3, 7, 8) and batch.features.dtype == np.float16
    assert batch.mask.sum(axis=1).tolist() == [7, 1, 6]
    for k, i in enumerate(ids):
        n = records[i].num
        np.testing.assert_array_equal(batch.features[k, :n], records[i].features.astype(np.float16))
        assert not batch.features[k, n:].any()
        np.testing.assert_array_equal(batch.boxes[k, :n], records[i].boxes)
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
    assert store.kind == "grid" and store.get(100).features.dtype == np.float32
    assert store.get(100).boxes is None


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
