"""The overlapped extraction loop (decode in workers, forward, commits in a writer thread) stores
exactly what the serial loop stores, commits in order, and hands a commit's error back."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.extract.kinds.grid import GridSettings, extract_grid, to_host
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from pipeline.features.extract.runner import Committer, finished
from pipeline.features.stores import open_store

GRID = GridSettings(backbone="resnet18", weights="random", image_size=64, grid=2)
REGIONS = RegionSettings(arch="c5", backbone="resnet18", weights="random", boxes="detect",
                         min_boxes=3, max_boxes=5, conf_thresh=0.2, min_size=64, max_size=64,
                         num_classes=4)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "shapes"
    write_shapes_dataset(root, n_train=14, n_val=2, n_test=2, seed=3, size=64)
    (root / "images" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # one skipped image
    dataset = json.loads((root / "dataset_shapes.json").read_text())
    dataset["images"].append({**dataset["images"][0], "filename": "broken.jpg", "imgid": 999,
                              "cocoid": 999})
    dataset["images"][-1]["filepath"] = "images"
    (root / "dataset_shapes.json").write_text(json.dumps(dataset))
    return root, root / "dataset_shapes.json"


def assert_same_stores(a, b) -> None:
    """Every record's every field equal, byte for byte, and the same skipped images."""
    first, second = open_store(a), open_store(b)
    assert list(first.ids()) == list(second.ids()) and len(first) > 0
    assert first.meta["skipped"] == second.meta["skipped"]
    for i in first.ids():
        x, y = first.get(int(i)), second.get(int(i))
        assert (x.height, x.width) == (y.height, y.width)
        assert set(x.fields) == set(y.fields)
        for name in x.fields:
            assert x.fields[name].dtype == y.fields[name].dtype
            assert x.fields[name].tobytes() == y.fields[name].tobytes(), (i, name)


@pytest.mark.parametrize("suffix", [".lmdb", ".h5"])
def test_overlapped_grid_extraction_stores_what_the_serial_loop_stores(shapes, tmp_path, suffix):
    image_root, dataset = shapes
    fmt = suffix.lstrip(".").replace("h5", "hdf5")
    runs = {name: extract_grid(dataset, image_root, GRID, root=tmp_path / name, batch_size=4,
                               workers=workers, write_ahead=ahead, progress=False, format=fmt)
            for name, workers, ahead in [("serial", 0, 0), ("overlapped", 2, 2)]}
    assert runs["serial"].store.suffix == suffix and runs["serial"].skipped == 1
    assert runs["serial"].fingerprint == runs["overlapped"].fingerprint
    assert_same_stores(runs["serial"].store, runs["overlapped"].store)


def test_overlapped_region_extraction_stores_what_the_serial_loop_stores(shapes, tmp_path):
    image_root, dataset = shapes
    runs = [extract_regions(dataset, image_root, REGIONS, root=tmp_path / f"r{ahead}",
                            batch_size=3, workers=workers, write_ahead=ahead, progress=False)
            for workers, ahead in [(0, 0), (2, 3)]]
    assert_same_stores(runs[0].store, runs[1].store)


def test_the_writer_thread_commits_in_order_off_the_loop_thread():
    committed, threads = [], set()

    def commit(batch, records):
        threads.add(threading.get_ident())
        committed.append((batch["n"], finished(records)))

    with Committer(commit, depth=2) as committer:
        for n in range(20):
            committer.put({"n": n}, (lambda n=n: [n]) if n % 2 else [n])  # unfinished and made
        committer.drain()
    assert committed == [(n, [n]) for n in range(20)]
    assert threads and threading.get_ident() not in threads


def test_a_commit_error_is_raised_in_the_loop_and_nothing_after_it_is_committed():
    committed = []
    release = threading.Event()

    def commit(batch, records):
        if batch["n"] == 2:
            release.wait(5)
            raise OSError("disk full")
        committed.append(batch["n"])

    with pytest.raises(OSError, match="disk full"):
        with Committer(commit, depth=2) as committer:
            for n in range(10):
                committer.put({"n": n}, [])
                if n == 3:
                    release.set()
            committer.drain()
    assert committed == [0, 1]


def test_leaving_by_an_error_commits_the_batches_put_before_it():
    committed = []
    with pytest.raises(RuntimeError, match="forward failed"):
        with Committer(lambda batch, records: committed.append(batch["n"]), depth=4) as c:
            for n in range(3):
                c.put({"n": n}, [])
            raise RuntimeError("forward failed")
    assert committed == [0, 1, 2]


def test_write_ahead_0_commits_in_the_loop_thread_at_once():
    committed = []
    with Committer(lambda batch, records: committed.append(threading.get_ident()), 0) as c:
        c.put({}, [])
        assert committed == [threading.get_ident()]


def test_a_cpu_tensor_is_its_own_host_copy():
    x = torch.arange(6.0).view(2, 3)
    host, landed = to_host(x)
    assert host is x and landed is None


@pytest.mark.cuda
@cuda
def test_a_cuda_tensor_lands_in_pinned_memory_after_its_event():
    x = torch.arange(6.0, device="cuda").view(2, 3)
    host, landed = to_host(x)
    assert host.is_pinned() and landed is not None
    landed.synchronize()
    assert torch.equal(host, x.cpu())


@pytest.mark.cuda
@cuda
def test_overlapped_extraction_on_cuda_stores_what_the_serial_loop_stores(shapes, tmp_path):
    image_root, dataset = shapes
    runs = [extract_grid(dataset, image_root, GRID, root=tmp_path / f"g{ahead}", batch_size=4,
                         workers=workers, write_ahead=ahead, progress=False, device="cuda")
            for workers, ahead in [(0, 0), (2, 2)]]
    assert_same_stores(runs[0].store, runs[1].store)
    assert runs[0].skipped == 1
