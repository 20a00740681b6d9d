"""What a hostile or careless user broke, written as the repros, kept fixed.

Each test starts from the situation the report describes (real files, real
processes) and checks the message, the exit status and that no data is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.stores import open_store
from trainer.config import load_experiment
from trainer.train import train
from trainer_fixtures import make_prepared, write_experiment, write_feature_store

CAPSTACK = str(Path(sys.executable).with_name("capstack"))  # the installed entry point
PLANTED = 'open("PWNED", "w").write("ran")\n'


def capstack(*args, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([CAPSTACK, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          **kw)


def plant_modules(folder: Path) -> None:
    """Modules capstack imports by name, planted where a careless user works."""
    for name in ("click.py", "cli.py", "yaml.py"):
        (folder / name).write_text(PLANTED)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardening")
    dataset, prepared = make_prepared(root)
    ids = load_captions(prepared).image_ids
    grid = write_feature_store(root / "grid.lmdb", ids, kind="grid", image_root=dataset.parent)
    return root, prepared, grid


# -- 1. code from the working folder -------------------------------------------------------

def test_a_stage_never_runs_modules_lying_in_the_working_folder(tmp_path):
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": "capstack shapes data/shapes --train 4 --val 2 --test 2 --size 32",
        "outs": ["data/shapes"]}}}))
    plant_modules(tmp_path)
    result = capstack("run", "shapes", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data/shapes/dataset_shapes.json").is_file()
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.slow
def test_torchrun_processes_never_run_modules_lying_in_the_working_folder(tmp_path):
    write_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=1, n_test=1, seed=0, size=32)
    plant_modules(tmp_path)
    result = capstack("extract-grid", "shapes/dataset_shapes.json", "shapes", "--backbone",
                      "resnet18", "--weights", "random", "--image-size", "64", "--grid", "2",
                      "--workers", "0", "--features-root", "features", "--nproc", "2",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "features").glob("grid-resnet18-*.lmdb"))
    assert not (tmp_path / "PWNED").exists()


# -- 2. two trainings into one run folder --------------------------------------------------

def test_a_second_training_into_a_busy_run_folder_is_refused_naming_the_holder(data, tmp_path):
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=10_000)
    first = subprocess.Popen([CAPSTACK, "train", str(exp), "--out", "runs/x"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        lock = tmp_path / "runs" / "x.lock"
        deadline = time.time() + 120
        while not (lock.is_file() and lock.read_text() and (tmp_path / "runs/x/config.json")
                   .is_file()):
            assert first.poll() is None and time.time() < deadline, "the first training ended"
            time.sleep(0.2)
        second = capstack("train", exp, "--out", "runs/x", "--set", "train.lr=0.1", cwd=tmp_path)
        assert second.returncode != 0
        assert f"training into runs/x is already running: held by pid {first.pid}" in \
            second.stderr, second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert json.loads((tmp_path / "runs/x/config.json").read_text())["train"]["lr"] == 5e-3


# -- 9. --restart-on-change deletes data ---------------------------------------------------

def test_a_second_restart_keeps_the_first_old_run(data, tmp_path):
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="gru_init", captions=prepared,
                           features=[grid], epochs=1)
    for hidden in (32, 16, 8):
        train(load_experiment(exp, [f"decoder.hidden={hidden}"]), tmp_path / "run",
              progress=False, restart_on_change=True)
    kept = {p.name: load_experiment_hidden(p) for p in tmp_path.glob("run*") if p.is_dir()}
    assert kept == {"run": 8, "run.old": 32, "run.old.2": 16}
    with pytest.raises(CapstackError, match="decoder.hidden"):
        train(load_experiment(exp, ["decoder.hidden=4"]), tmp_path / "run", progress=False)


def load_experiment_hidden(run: Path) -> int:
    return json.loads((run / "config.json").read_text())["decoder"]["hidden"]


# -- 3. images that are no files -------------------------------------------------------------

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


# -- 8. an empty validation split ----------------------------------------------------------

def test_an_empty_validation_split_is_refused_before_the_first_step(tmp_path):
    dataset, prepared = make_prepared(tmp_path, n_val=0)
    grid = write_feature_store(tmp_path / "grid.lmdb", load_captions(prepared).image_ids,
                               kind="grid", image_root=dataset.parent)
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    result = capstack("train", exp, "--out", "runs/x", cwd=tmp_path)
    assert result.returncode != 0
    assert f"{prepared}: the val split has no images" in result.stderr, result.stderr
    assert not (tmp_path / "runs" / "x").exists()  # 11: no empty run folder left behind


# -- 5. a valid but extreme image ------------------------------------------------------------

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


# -- 6. a truncated LMDB store -----------------------------------------------------------------

def test_a_truncated_lmdb_store_is_named_not_a_sigbus(tmp_path):
    root = tmp_path / "features"
    root.mkdir()
    ids = list(range(400))
    damaged = write_feature_store(root / "grid-a.lmdb", ids, kind="grid", rows=49, dim=256)
    whole = write_feature_store(root / "grid-b.lmdb", ids[:5], kind="grid", fingerprint="c0ffee")
    data = damaged / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    write_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=1, n_test=1, seed=0, size=32)
    for verb in (["inspect"], ["verify", "--dataset", tmp_path / "shapes/dataset_shapes.json"]):
        result = capstack(*verb, damaged, cwd=tmp_path)  # a subprocess: a SIGBUS fails the test
        assert result.returncode == 1, (verb, result.returncode, result.stderr)
        assert f"{data}: truncated LMDB store" in result.stderr, result.stderr
    listing = capstack("stores", "--features-root", root, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "truncated LMDB store" in listing.stdout and whole.name in listing.stdout


# -- 4. NaN and flipped bytes ----------------------------------------------------------------

def test_a_checkpoint_with_flipped_bytes_is_refused(data, tmp_path):
    import torch

    from trainer.checkpoint import load_checkpoint

    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    train(load_experiment(exp), tmp_path / "run", progress=False)
    path = tmp_path / "run" / "last.pt"
    weight = max(load_checkpoint(path)["model"].values(), key=lambda t: t.numel())
    raw = bytearray(path.read_bytes())
    at = raw.find(weight.reshape(-1)[:8].numpy().tobytes())
    assert at > 0
    raw[at + 5] ^= 0x10  # one bit of one weight
    path.write_bytes(bytes(raw))
    assert torch.load(path, weights_only=True)  # torch itself reads it without complaint
    for args in (["evaluate", path, "--out", tmp_path / "eval"],
                 ["train", exp, "--out", tmp_path / "run", "--set", "train.epochs=2"]):
        result = capstack(*args, cwd=tmp_path)
        assert result.returncode == 1 and f"{path}: damaged checkpoint" in result.stderr, \
            result.stderr


def test_nan_in_a_store_fails_verify_deep_and_stops_training_naming_the_images(data, tmp_path):
    import shutil

    import lmdb
    import numpy as np

    from pipeline.features.stores import open_store
    from pipeline.features.stores.lmdb import _record_key, encode_record

    root, prepared, grid = data
    poisoned = tmp_path / "grid-nan.lmdb"
    shutil.copytree(grid, poisoned)
    store = open_store(grid)
    ids = [int(i) for i in store.ids()]
    record = store.get(ids[0])
    record.features[0, 0] = np.nan
    env = lmdb.open(str(poisoned), subdir=True)
    with env.begin(write=True) as txn:  # written by another tool, checksum and all
        txn.put(_record_key(ids[0]), encode_record(record, store.schema))
    env.close()
    dataset = root / "shapes" / "dataset_shapes.json"
    assert capstack("verify", poisoned, "--dataset", dataset, cwd=tmp_path).returncode == 0
    deep = capstack("verify", poisoned, "--dataset", dataset, "--deep", cwd=tmp_path)
    assert deep.returncode == 1
    assert f"{poisoned}: image {ids[0]}: features: 1 of" in deep.stderr, deep.stderr
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[poisoned], epochs=2)
    result = capstack("train", exp, "--out", "run", cwd=tmp_path)
    assert result.returncode == 1
    assert "run: the loss is nan at step" in result.stderr and str(ids[0]) in result.stderr, \
        result.stderr
    assert not (tmp_path / "run").exists()  # 11: no checkpoint, so no run folder left behind


def flip_one_bit_of_a_record(store: Path) -> int:
    """Flip a bit inside the first record's features on disk; the record's image id."""
    import numpy as np

    reader = open_store(store)
    image_id = int(reader.ids()[0])
    values = reader.get(image_id).features[0].tobytes()
    reader.close()
    target = store / "data.mdb" if store.is_dir() else store
    raw = bytearray(target.read_bytes())
    at = raw.find(values)
    assert at > 0 and np.frombuffer(values, np.float16).any()
    while at >= 0:  # LMDB may keep a stale copy of the page: flip every copy
        raw[at + 3] ^= 0x04
        at = raw.find(values, at + 1)
    target.write_bytes(bytes(raw))
    return image_id


@pytest.mark.parametrize("name", ["grid.lmdb", "grid.h5"])
def test_a_store_with_a_flipped_bit_is_named_by_verify_deep_and_by_training(data, tmp_path,
                                                                             name):
    root, prepared, _ = data
    ids = load_captions(prepared).image_ids
    store = write_feature_store(tmp_path / name, ids, kind="grid")
    assert open_store(store).meta["record_checksum"] in ("xxh3_64", "fletcher32")
    image_id = flip_one_bit_of_a_record(store)
    dataset = root / "shapes" / "dataset_shapes.json"
    deep = capstack("verify", store, "--dataset", dataset, "--deep", cwd=tmp_path)
    assert deep.returncode == 1, deep.stdout
    assert f"{store}: image {image_id}: record is damaged" in deep.stderr, deep.stderr
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[store], epochs=1)
    result = capstack("train", exp, "--out", "run", cwd=tmp_path)
    assert result.returncode == 1 and f"{store}: " in result.stderr
    assert "record is damaged" in result.stderr and str(image_id) in result.stderr, \
        result.stderr


# -- 10. a full or read-only disk ------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of ``size`` (a tmpfs; root may mount one), later ``resize``d or made
    read-only. Skipped where no tmpfs can be mounted."""
    mounts = []

    def mount(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def test_a_full_disk_names_the_store_keeps_its_records_and_the_rerun_resumes(data, tmp_path,
                                                                             small_disk):
    from process_helpers import committed_records

    root, _, _ = data
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


def test_a_training_on_a_full_disk_names_the_checkpoint_and_keeps_the_last_good_one(
        data, tmp_path, small_disk):
    from trainer.checkpoint import load_checkpoint

    _, prepared, grid = data
    disk = small_disk("disk", "2m")
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    assert capstack("train", exp, "--out", disk / "run", cwd=tmp_path).returncode == 0
    with open(disk / "filler", "wb") as filler:  # the disk fills up between two trainings
        with pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    result = capstack("train", exp, "--out", disk / "run", "--set", "train.epochs=2",
                      cwd=tmp_path)
    assert result.returncode == 1
    assert f"{disk / 'run'}/" in result.stderr and ": cannot write it (No space left on " \
        "device); nothing written before was changed" in result.stderr, result.stderr
    assert load_checkpoint(disk / "run" / "last.pt")["epoch"] == 1  # whole, and the last good
    for line in (disk / "run" / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # no half-written line for a resume to choke on
    assert not list((disk / "run").glob(".*tmp*"))  # no half-written checkpoint left


def test_every_writing_command_names_a_read_only_output(data, tmp_path, small_disk):
    root, prepared, grid = data
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


def test_an_id_beyond_64_bits_and_100k_deep_json_or_yaml_are_named(tmp_path):
    write_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, n_test=1, seed=0, size=32)
    dataset = json.loads((tmp_path / "shapes" / "dataset_shapes.json").read_text())
    dataset["images"][1]["imgid"] = 2 ** 70
    (tmp_path / "big.json").write_text(json.dumps(dataset))
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.json").write_text(deep)
    (tmp_path / "deep.yaml").write_text(deep)
    (tmp_path / "stages.yaml").write_text(deep)
    for args, message in [
            (["prepare", "big.json", "out"], f"big.json: images[1].imgid: {2 ** 70} is outside "
                                             f"0..2**63-1"),
            (["extract-grid", "big.json", "shapes", "--backbone", "resnet18", "--weights",
              "random"], "big.json: images[1].imgid: "),
            (["prepare", "deep.json", "out"], "deep.json: nested deeper than the "),
            (["train", "deep.yaml", "--out", "run"], "deep.yaml: nested deeper than the "),
            (["stages"], "stages.yaml: nested deeper than the ")]:
        result = capstack(*args, cwd=tmp_path)
        assert result.returncode == 1 and message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_an_hdf5_store_with_a_flipped_bit_in_its_index_is_named_by_plain_verify(data,
                                                                                 tmp_path):
    import numpy as np

    root, prepared, _ = data
    ids = load_captions(prepared).image_ids
    store = write_feature_store(tmp_path / "grid.h5", ids, kind="grid")
    raw = bytearray(store.read_bytes())
    at = raw.find(np.array(ids, np.int64).tobytes())
    assert at > 0
    raw[at + 8] ^= 0x01  # the second image's id
    store.write_bytes(bytes(raw))
    result = capstack("verify", store, "--dataset", root / "shapes" / "dataset_shapes.json",
                      cwd=tmp_path)
    assert result.returncode == 1
    assert f"{store}: the record index is damaged (" in result.stderr, result.stderr


# -- 7. sizes without bounds ---------------------------------------------------------------------

@pytest.mark.parametrize("args, bound", [
    (["extract-grid", "d.json", ".", "--image-size", "20000"], "20000 is not in the range "
                                                               "32<=x<=2048"),
    (["prepare", "d.json", "out", "--max-len", "100000000"], "100000000 is not in the range "
                                                             "1<=x<=1000"),
    (["extract-grid", "d.json", ".", "--grid", "0"], "0 is not in the range 1<=x<=64"),
    (["extract-regions", "d.json", ".", "--batch", "0"], "0 is not in the range 1<=x<=4096"),
    (["extract-grid", "d.json", ".", "--workers", "-1"], "-1 is not in the range 0<=x<=64"),
    # issue 31, item 9: numbers that reached numpy or torch unchecked; click's FloatRange lets
    # nan through, FiniteRange (cli.py) does not
    (["prepare", "d.json", "out", "--min-count", "100000000000000000000"],
     "100000000000000000000 is not in the range 1<=x<=1000000000"),
    (["import-features", "butd", "src", "--dataset", "d.json", "--out", "o", "--commit-mb",
      "nan"], "nan is not a finite number in the range 0<x<=1048576"),
    (["import-features", "butd", "src", "--dataset", "d.json", "--out", "o", "--commit-mb",
      "-5"], "-5.0 is not in the range 0<x<=1048576"),
    (["extract-regions", "d.json", ".", "--conf-thresh", "nan"],
     "nan is not a finite number in the range 0<=x<=1"),
    (["train-detector", "d.json", ".", "o.pt", "--seed", "-1"],
     "-1 is not in the range 0<=x<=4294967295"),
    (["evaluate", "run", "--figures", "-1"], "-1 is not in the range 0<=x<=1000"),
])
def test_every_size_a_user_gives_has_a_bound_named_before_work_starts(tmp_path, args, bound):
    result = capstack(*args, cwd=tmp_path)
    assert result.returncode == 2 and bound in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing started


def test_a_yaml_alias_bomb_in_a_stages_file_is_refused_at_once(tmp_path):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]" for k in range(1, 9)]
    (tmp_path / "stages.yaml").write_text("\n".join(levels) + "\nstages:\n  s:\n    foreach: *a8\n"
                                          "    do: {cmd: capstack shapes out}\n")
    started = time.perf_counter()
    result = capstack("stages", cwd=tmp_path)
    assert time.perf_counter() - started < 30 and len(result.stderr) < 1000
    assert result.returncode == 1 and "more than 100000 values once its YAML aliases are " \
        "expanded" in result.stderr, result.stderr[:500]


def test_a_stage_declared_twice_or_a_non_utf8_stages_file_is_named(tmp_path):
    stage = "  s:\n    cmd: capstack shapes out\n    outs: [out]\n"
    (tmp_path / "stages.yaml").write_text("stages:\n" + stage + stage)
    result = capstack("stages", cwd=tmp_path)
    assert result.returncode == 1 and "the key 's' appears twice" in result.stderr, result.stderr
    (tmp_path / "stages.yaml").write_bytes(b"stages:\n  s:\n    cmd: capstack shapes caf\xe9\n")
    result = capstack("stages", cwd=tmp_path)
    assert result.returncode == 1 and "stages.yaml: not UTF-8 text (byte 41 is 0xe9)" in \
        result.stderr, result.stderr


# -- 10. damaged caches and records ------------------------------------------------------------

def test_a_damaged_lock_file_or_hash_cache_is_set_aside_and_said(tmp_path):
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": "capstack shapes data/shapes --train 4 --val 2 --test 2 --size 32",
        "outs": ["data/shapes"]}}}))
    assert capstack("run", "shapes", cwd=tmp_path).returncode == 0
    lock, cache = tmp_path / "stages.lock", tmp_path / ".capstack" / "hashes.sqlite"
    damaged_lock = b"stages: {shapes: [unclosed\n\xff"
    lock.write_bytes(damaged_lock)
    cache.write_bytes(b"not a database, just bytes" * 100)
    result = capstack("stages", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stages.lock: damaged lock file (not UTF-8 text); moved to" in result.stderr
    assert "hashes.sqlite: damaged hash cache" in result.stderr and "rebuilt" in result.stderr
    assert (tmp_path / "stages.lock.damaged").read_bytes() == damaged_lock  # nothing lost
    assert "never run" in result.stdout
    again = capstack("run", "shapes", cwd=tmp_path)
    assert again.returncode == 0 and "Running stage 'shapes'" in again.stdout, again.stderr
    assert "up to date" in capstack("stages", cwd=tmp_path).stdout


@pytest.mark.parametrize("setting, message", [
    ("decoder.dropout=1.5", "exp.yaml: decoder.dropout: a probability, must be below 1, got 1.5"),
    ("decoder.embed=-4", "exp.yaml: decoder.embed: must be from 1 to 65536, got -4"),
    ("train.device=quantum", "exp.yaml: train.device: unknown device 'quantum'"),
    ("train.lr=[", "--set 'train.lr=[': the value is not valid YAML"),
])
def test_a_bad_experiment_value_is_named_not_a_traceback(data, tmp_path, setting, message):
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    result = capstack("train", "exp.yaml", "--out", "run", "--set", setting, cwd=tmp_path)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
    exp.write_bytes(exp.read_bytes().replace(b"name:", b"n\xe4me:", 1))
    result = capstack("train", "exp.yaml", "--out", "run", cwd=tmp_path)
    assert result.returncode == 1 and "exp.yaml: not UTF-8 text (byte" in result.stderr


def test_an_unknown_device_is_named(tmp_path):
    write_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, n_test=1, seed=0, size=32)
    result = capstack("extract-grid", "shapes/dataset_shapes.json", "shapes", "--weights",
                      "random", "--backbone", "resnet18", "--device", "potato", cwd=tmp_path)
    assert result.returncode == 1 and "device: unknown device 'potato'" in result.stderr, \
        result.stderr


# -- 11. SIGTERM -----------------------------------------------------------------------------------

def test_sigterm_stops_a_training_saying_so_and_the_same_command_resumes(data, tmp_path):
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=10_000)
    run = subprocess.Popen([CAPSTACK, "train", str(exp), "--out", "run"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    deadline = time.time() + 120
    while not (tmp_path / "run" / "last.pt").is_file():  # an epoch done: something to keep
        assert run.poll() is None and time.time() < deadline, run.communicate()
        time.sleep(0.2)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 143 and "stopped by SIGTERM" in stderr, (run.returncode, stderr)
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["state"] == "stopped" and state["error"].startswith("stopped by SIGTERM")
    resumed = capstack("train", exp, "--out", "run", "--set", "train.epochs=1", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr  # the lock was released, the run intact


# -- 11. smaller things --------------------------------------------------------------------------

def test_a_deleted_shared_store_makes_its_stage_stale_and_the_rerun_extracts_it(tmp_path):
    import shutil

    from test_feature_stages import STAGES

    data = tmp_path / "shapes"
    write_shapes_dataset(data, n_train=4, n_val=1, n_test=1, seed=2, size=32)
    (tmp_path / "stages.yaml").write_text(STAGES.format(data=data, root=tmp_path / "root"))
    assert capstack("run", "extract_grid", cwd=tmp_path).returncode == 0
    store = Path(json.loads((tmp_path / "features/grid.json").read_text())["store"])
    shutil.rmtree(store)  # another experiment's owner cleaned the shared root
    listing = capstack("stages", cwd=tmp_path)
    assert f"out features/grid.json points to {store}, which is gone" in listing.stdout, \
        listing.stdout
    rerun = capstack("run", "extract_grid", cwd=tmp_path)
    assert rerun.returncode == 0 and "extracted 6 images" in rerun.stdout, rerun.stderr
    assert len(open_store(store)) == 6


@pytest.mark.parametrize("out", ["../elsewhere", "/tmp/capstack-outside-{name}"])
def test_an_out_outside_the_workdir_is_refused_unless_the_user_opts_in(tmp_path, out):
    out = out.format(name=tmp_path.name)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": f"capstack shapes {out} --train 2 --val 1 --test 1 --size 32", "outs": [out]}}}))
    written = (workdir / out).resolve()
    refused = capstack("run", "shapes", cwd=workdir)
    assert refused.returncode == 1 and f"stages.shapes.outs: '{out}' is outside the workdir " \
        f"{workdir}" in refused.stderr and "--outs-outside-workdir" in refused.stderr
    assert not written.exists()
    try:
        allowed = capstack("run", "shapes", "--outs-outside-workdir", cwd=workdir)
        assert allowed.returncode == 0, allowed.stderr
        assert (written / "dataset_shapes.json").is_file()
    finally:
        import shutil
        shutil.rmtree(written, ignore_errors=True)


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



def test_a_store_root_that_is_a_file_is_named(tmp_path, monkeypatch):
    """Repro: CAPSTACK_FEATURES pointing at a file was refused as 'File exists'."""
    from pipeline.features.placement import features_root

    a_file = tmp_path / "features"
    a_file.write_text("not a folder")
    monkeypatch.setenv("CAPSTACK_FEATURES", str(a_file))
    with pytest.raises(CapstackError, match=r"\$CAPSTACK_FEATURES names a file, not a folder"):
        features_root()
    with pytest.raises(CapstackError, match="--features-root names a file"):
        features_root(a_file)
    monkeypatch.setenv("CAPSTACK_FEATURES", str(tmp_path / "new"))
    assert features_root() == tmp_path / "new"  # a missing one is made when written
    write_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, n_test=1, seed=0, size=32)
    result = capstack("extract-grid", tmp_path / "shapes" / "dataset_shapes.json",
                      tmp_path / "shapes", "--backbone", "resnet18", "--weights", "random",
                      "--image-size", "64", "--workers", "0", cwd=tmp_path,
                      env={**os.environ, "CAPSTACK_FEATURES": str(a_file)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "$CAPSTACK_FEATURES names a file" in result.stderr.splitlines()[-1]
    assert a_file.read_text() == "not a folder"
