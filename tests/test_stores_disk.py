"""Feature stores on a full or read-only disk (a small tmpfs, where one can be mounted): the
store is named, its committed records kept and the rerun resumes; every writing command names
a read-only output; a partial store too damaged to resume is started again; a complete store
on a read-only root is reused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from pipeline.features.stores import create_writer, open_store
from process_helpers import capstack, remount, run_capstack
from trainer_fixtures import test_meta as store_meta
from trainer_fixtures import write_experiment

SHAPES = dict(n_train=40, n_val=4, n_test=4, seed=0)  # conftest's shapes


def test_a_full_disk_names_the_store_keeps_its_records_and_the_rerun_resumes(data, tmp_path,
                                                                             small_disk):
    from process_helpers import committed_records

    root, _, _, _ = data
    disk = small_disk("disk", "160k")
    args = ("extract-grid", root / "shapes" / "dataset_shapes.json", root / "shapes",
            "--backbone", "resnet18", "--weights", "random", "--image-size", "64", "--grid", "4",
            "--dtype", "float16", "--workers", "0", "--batch", "2", "--features-root", disk)
    full = capstack(*args, cwd=tmp_path)
    assert full.returncode == 1, full.stderr
    partial = next(disk.glob("grid-*.lmdb.partial"))
    assert f"{partial}: cannot write it (" in full.stderr and "records committed before " \
        "are kept" in full.stderr, full.stderr
    kept = committed_records(partial)
    assert 0 < kept < 20
    remount(disk, "size=20m")
    again = capstack(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {kept} " in again.stdout + again.stderr
    assert len(open_store(next(disk.glob("grid-*.lmdb")))) == 20


def test_every_writing_command_names_a_read_only_output(data, tmp_path, small_disk):
    root, prepared, grid, _ = data
    disk = small_disk("disk", "1m")
    remount(disk, "ro")
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    dataset = root / "shapes" / "dataset_shapes.json"
    for args, named in [
            (["shapes", disk / "shapes", "--train", "2", "--val", "1", "--test", "1"],
             disk / "shapes"),
            (["prepare", dataset, disk / "prepared"], disk / "prepared"),
            (["extract-grid", dataset, root / "shapes", "--backbone", "resnet18", "--weights",
              "random", "--image-size", "64", "--features-root", disk], disk),
            (["train", exp, "--out", disk / "run"], disk / "run"),
            (["export-features", grid, "rtl-npz", disk / "x"], disk)]:
        result = capstack(*args, cwd=tmp_path)
        assert result.returncode == 1, (args, result.stderr)
        assert "Read-only file system" in result.stderr and "Traceback" not in result.stderr
        assert f"{named}" in result.stderr.splitlines()[-1], (args, result.stderr)


ROOT = Path(__file__).resolve().parents[1]


# Writes records of 16 x 512 floats (image k's all k) into an HDF5 store until the disk
# refuses, with the room check before each commit switched off: the disk fills between the
# check and the write, as when another writer takes the room.
FILL = """\
import sys
sys.path.insert(0, "tests")
from pathlib import Path
import numpy as np
import pipeline.features.stores.hdf5 as hdf5
from pipeline.core.errors import CapstackError
from pipeline.features.stores import Record, create_writer
from trainer_fixtures import test_meta as store_meta

hdf5.check_room = lambda path, nbytes: None
try:
    with create_writer(Path(sys.argv[1]), store_meta("grid", 512, "f11")) as writer:
        for k in range(100_000):
            writer.write([(k, Record(np.full((16, 512), k, np.float32), 64, 64))])
except CapstackError as error:
    print(error)
"""


def fill(store: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FILL, str(store)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def complete(store: Path) -> int:
    """Resume the store, add image 60_000 and finish it; the records resumed."""
    with create_writer(store, store_meta("grid", 512, "f11")) as writer:
        resumed = len(writer.done)
        writer.write([(60_000, _record(60_000))])
        writer.finish()
    return resumed


def _record(k: int):
    from pipeline.features.stores import Record

    return Record(np.full((16, 512), k, np.float32), 64, 64)


def test_extraction_into_hdf5_on_a_full_disk_says_so_and_the_rerun_resumes(shapes, tmp_path,
                                                                           small_disk):
    disk = small_disk("disk", "6m")
    args = ("extract-grid", shapes[1], shapes[0], "--backbone", "resnet18",
            "--weights", "random", "--image-size", "64", "--grid", "4", "--workers", "0",
            "--batch", "2", "--features-root", disk, "--format", "hdf5")
    full = run_capstack(*args, cwd=tmp_path, timeout=300)
    assert full.returncode == 1, full.stderr  # not 139: HDF5 never met the full disk
    partial = next(disk.glob("grid-*.h5.partial"))
    last = full.stderr.splitlines()[-1]
    assert last.startswith(f"Error: {partial}: cannot write it (No space left on device") and \
        "records committed before are kept: make room, then run again to resume" in last, \
        full.stderr
    assert "Traceback" not in full.stderr
    remount(disk, "size=40m")
    again = run_capstack(*args, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resuming: " in again.stdout + again.stderr
    assert len(open_store(next(disk.glob("grid-*.h5")))) == 48
    assert not list(disk.glob("*.reserve"))


def test_hdf5_meeting_a_full_disk_anyway_closes_the_store_at_its_last_commit(tmp_path,
                                                                             small_disk):
    disk = small_disk("disk", "6m")
    store = disk / "x.h5"
    result = fill(store)
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert message.startswith(f"{store}.partial: cannot write it (No space left on device); "
                              f"the "), result.stdout
    kept = int(message.split("; the ")[1].split()[0])
    assert kept > 0
    remount(disk, "size=40m")
    assert complete(store) == kept
    reader = open_store(store)
    assert len(reader) == kept + 1
    assert all((reader.get(k).features == k).all() for k in (0, kept - 1, 60_000))


def test_a_partial_store_too_damaged_to_resume_is_started_again(tmp_path, caplog):
    import struct

    store = tmp_path / "x.h5"
    with create_writer(store, store_meta("grid", 512, "f11")) as writer:
        for k in range(6):
            writer.write([(k, _record(k))])
    with open(writer.partial, "r+b") as f:  # what a process killed by HDF5 left: the file's
        f.seek(40)  # end (its superblock's "end of file address") before what it indexes
        f.write(struct.pack("<Q", 7632))
    assert complete(store) == 0  # was: OSError: Can't synchronously read data (addr overflow)
    assert f"{writer.partial}: damaged (Can't synchronously read data (addr overflow" in \
        caplog.text and "starting it again" in caplog.text
    assert len(open_store(store)) == 1


def test_a_complete_store_on_a_read_only_root_is_reused(data, tmp_path, small_disk):
    dataset = data.dataset
    disk = small_disk("features", "20m")
    args = ("extract-grid", dataset, dataset.parent, "--backbone", "resnet18", "--weights",
            "random", "--image-size", "64", "--grid", "2", "--workers", "0", "--features-root",
            disk, "--pointer")
    assert run_capstack(*args, "first.json", cwd=tmp_path).returncode == 0
    remount(disk, "ro")
    reused = run_capstack(*args, "grid.json", cwd=tmp_path)  # another user: recorded, once
    assert reused.returncode == 0, reused.stderr  # was: users.json: cannot write it ...
    store = next(disk.glob("grid-*.lmdb"))
    assert f"reusing store {store}" in reused.stdout
    assert f"{store}.users.json: this use of the store goes unrecorded (Read-only file " \
        f"system)" in reused.stderr
    assert json.loads((tmp_path / "grid.json").read_text())["store"] == str(store)
