"""HDF5 on a full disk: one line and a store the next run resumes, never a segmentation fault.

Real filesystems (a small tmpfs, skipped where none can be mounted) and real processes: HDF5
meeting a full disk used to end the process with status 139, so every write that may meet one
runs in a child process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.stores import create_writer, open_store
from process_helpers import run_capstack
from test_hardening import remount, small_disk  # noqa: F401 - the fixture, used by name
from trainer_fixtures import test_meta as store_meta

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


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("disk")
    write_shapes_dataset(root / "shapes", n_train=40, n_val=4, n_test=4, seed=0, size=64)
    return root / "shapes"


def test_extraction_into_hdf5_on_a_full_disk_says_so_and_the_rerun_resumes(shapes, tmp_path,
                                                                           small_disk):
    disk = small_disk("disk", "6m")
    args = ("extract-grid", shapes / "dataset_shapes.json", shapes, "--backbone", "resnet18",
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


def test_prepare_on_a_full_disk_says_so_in_one_line(tmp_path, small_disk):
    disk = small_disk("disk", "100k")
    write_shapes_dataset(tmp_path / "big", n_train=2000, n_val=10, n_test=10, seed=0, size=32)
    result = run_capstack("prepare", tmp_path / "big" / "dataset_shapes.json", disk / "prep",
                          "--min-count", "1", cwd=tmp_path, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"Error: {disk / 'prep'}: cannot write it (No space left on device); nothing written "
        f"before was changed: make room or choose another place, then run again")
    assert not list(disk.iterdir())


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
