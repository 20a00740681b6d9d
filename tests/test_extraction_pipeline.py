"""The overlapped extraction loop (decode in workers, forward, commits in a writer thread) stores
exactly what the serial loop stores, commits in order, and hands a commit's error back. Images
it cannot use (a FIFO or a device, a 1x10000 strip, one the detector finds nothing in, a
filename leaving the image root) are skipped or refused by name, and a killed extraction's
workers hold no lock."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading

import numpy as np
import pytest
import torch

from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.extract.kinds.grid import GridSettings, extract_grid, to_host
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from pipeline.features.extract.runner import Committer, finished
from pipeline.features.stores import open_store
from process_helpers import CAPSTACK, capstack

GRID = GridSettings(backbone="resnet18", weights="random", image_size=64, grid=2)
REGIONS = RegionSettings(arch="c5", backbone="resnet18", weights="random", boxes="detect",
                         min_boxes=3, max_boxes=5, conf_thresh=0.2, min_size=64, max_size=64,
                         num_classes=4)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


@pytest.fixture(scope="module")
def broken_shapes(tmp_path_factory):
    """A shapes dataset with one image that is no JPEG: its own folder, as it changes one."""
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
def test_overlapped_grid_extraction_stores_what_the_serial_loop_stores(broken_shapes, tmp_path,
                                                                       suffix):
    image_root, dataset = broken_shapes
    fmt = suffix.lstrip(".").replace("h5", "hdf5")
    runs = {name: extract_grid(dataset, image_root, GRID, root=tmp_path / name, batch_size=4,
                               workers=workers, write_ahead=ahead, progress=False, format=fmt)
            for name, workers, ahead in [("serial", 0, 0), ("overlapped", 2, 2)]}
    assert runs["serial"].store.suffix == suffix and runs["serial"].skipped == 1
    assert runs["serial"].fingerprint == runs["overlapped"].fingerprint
    assert_same_stores(runs["serial"].store, runs["overlapped"].store)


def test_overlapped_region_extraction_stores_what_the_serial_loop_stores(broken_shapes, tmp_path):
    image_root, dataset = broken_shapes
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
def test_overlapped_extraction_on_cuda_stores_what_the_serial_loop_stores(broken_shapes,
                                                                          tmp_path):
    image_root, dataset = broken_shapes
    runs = [extract_grid(dataset, image_root, GRID, root=tmp_path / f"g{ahead}", batch_size=4,
                         workers=workers, write_ahead=ahead, progress=False, device="cuda")
            for workers, ahead in [(0, 0), (2, 2)]]
    assert_same_stores(runs[0].store, runs[1].store)
    assert runs[0].skipped == 1


def test_a_fifo_or_a_device_as_an_image_is_skipped_not_read(tmp_path):
    write_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=1, n_test=1, seed=0, size=32)
    dataset = tmp_path / "shapes" / "dataset_shapes.json"
    data = json.loads(dataset.read_text())
    odd = tmp_path / "shapes" / "odd"
    odd.mkdir()
    os.mkfifo(odd / "fifo.png")
    (odd / "zero.png").symlink_to("/dev/zero")
    for k, name in enumerate(["fifo.png", "zero.png"]):
        data["images"][k].update(filepath="odd", filename=name)
    dataset.write_text(json.dumps(data))
    result = capstack("extract-grid", dataset, tmp_path / "shapes", "--backbone", "resnet18",
                      "--weights", "random", "--image-size", "64", "--grid", "2", "--workers",
                      "0", "--features-root", "features", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    store = open_store(next((tmp_path / "features").glob("grid-resnet18-*.lmdb")))
    assert len(store) == 4
    skipped = store.meta["skipped"]
    assert set(skipped) == {str(data["images"][0]["imgid"]), str(data["images"][1]["imgid"])}
    assert skipped[str(data["images"][0]["imgid"])].startswith(f"{odd / 'fifo.png'}: ")
    assert all("not a regular file" in why for why in skipped.values()), skipped  # 11: the file


def test_a_1x10000_image_is_skipped_with_its_reason_and_the_extraction_goes_on(tmp_path):
    from PIL import Image

    write_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=1, n_test=1, seed=0, size=32)
    dataset = tmp_path / "shapes" / "dataset_shapes.json"
    data = json.loads(dataset.read_text())
    Image.new("RGB", (10000, 1), (200, 30, 30)).save(tmp_path / "shapes" / "strip.png")
    data["images"][0].update(filepath="", filename="strip.png")
    dataset.write_text(json.dumps(data))
    args = ["extract-regions", dataset, tmp_path / "shapes", "--arch", "c5", "--backbone",
            "resnet18", "--weights", "random", "--num-classes", "3", "--min-boxes", "2",
            "--max-boxes", "3", "--min-size", "64", "--max-size", "128", "--workers", "0",
            "--features-root", "features"]
    for _ in range(2):  # a rerun meets the same image, and goes on again
        result = capstack(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    store = open_store(next((tmp_path / "features").glob("*.lmdb")))
    assert len(store) == 5
    reason = store.meta["skipped"][str(data["images"][0]["imgid"])]
    assert "too thin for the detector: 10000x1" in reason and "strip.png" in reason, reason


def test_dataset_filenames_leaving_the_image_root_are_refused_unless_the_user_opts_in(tmp_path):
    write_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, n_test=1, seed=0, size=32)
    dataset = json.loads((tmp_path / "shapes" / "dataset_shapes.json").read_text())
    dataset["images"][0].update(filepath="", filename="/etc/passwd")
    dataset["images"][1]["filepath"] = "../shapes/images"
    (tmp_path / "escaping.json").write_text(json.dumps(dataset))
    args = ["extract-grid", "escaping.json", "shapes", "--backbone", "resnet18", "--weights",
            "random", "--image-size", "64", "--grid", "2", "--workers", "0",
            "--features-root", "features"]
    refused = capstack(*args, cwd=tmp_path)
    assert refused.returncode == 1
    assert "escaping.json: images[0] (imgid 0): '/etc/passwd' leaves the image root; images " \
        "are read only below it unless you pass --images-outside-root" in refused.stderr, \
        refused.stderr
    assert not (tmp_path / "features").exists() or not list((tmp_path / "features").glob("*"))
    allowed = capstack(*args, "--images-outside-root", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    store = open_store(next((tmp_path / "features").glob("grid-*.lmdb")))
    assert len(store) == 3 and "/etc/passwd: " in store.meta["skipped"]["0"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_dataloader_workers_of_a_killed_extraction_do_not_hold_its_lock(tmp_path, sig):
    import fcntl

    from process_helpers import committed_records, wait_for

    write_shapes_dataset(tmp_path / "shapes", n_train=60, n_val=2, n_test=2, seed=1, size=64)
    proc = subprocess.Popen(
        [CAPSTACK, "extract-grid", "shapes/dataset_shapes.json", "shapes", "--backbone",
         "resnet18", "--weights", "random", "--image-size", "64", "--grid", "2", "--batch", "1",
         "--workers", "2", "--features-root", "features"], cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        partial = wait_for(lambda: next((tmp_path / "features").glob("*.partial"), None))
        wait_for(lambda: committed_records(partial) >= 2)
        os.kill(proc.pid, sig)  # the main process only, as a scheduler or a user would
        assert proc.wait(60) != 0
        lock = partial.with_name(partial.name.replace(".partial", ".lock"))
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while held
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_extraction_keeps_no_image_without_regions(tmp_path):
    from pipeline.features.extract.region_extraction import RegionSettings, extract_regions

    with pytest.raises(CapstackError, match=r"--min-boxes/--max-boxes: need 1 <= min <= max"):
        extract_regions(tmp_path / "d.json", tmp_path, RegionSettings(min_boxes=0))


def test_an_image_the_detector_finds_nothing_in_is_skipped_with_its_reason(tmp_path):
    from pipeline.features.extract.runner import NO_REGIONS, run_extraction
    from pipeline.features.stores import Record

    class Writer:
        done, meta, partial = set(), {"producer": {"name": "x"}}, tmp_path

        def write(self, records, skipped):
            self.records, self.skipped = records, skipped

    class Images(list):
        pass

    import pipeline.features.extract.runner as runner

    batches = [{"image_ids": [1, 2], "skipped": []}]
    writer = Writer()
    original = runner.DataLoader
    runner.DataLoader = lambda *a, **k: batches
    try:
        model = lambda batch: [Record(np.ones((2, 4), np.float32), 1, 1),  # noqa: E731
                               Record(np.ones((0, 4), np.float32), 1, 1)]
        report = run_extraction([(1, tmp_path / "a.jpg"), (2, tmp_path / "b.jpg")], writer,
                                model, None, batch_size=2, workers=0, progress=False)
    finally:
        runner.DataLoader = original
    assert [i for i, _ in writer.records] == [1] and report.extracted == 1
    assert writer.skipped == [(2, f"{tmp_path / 'b.jpg'}: {NO_REGIONS}")]
