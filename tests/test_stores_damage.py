"""Damaged feature stores are named, never a crash: a truncated LMDB store, NaN or a flipped bit
in a record, a flipped bit in an HDF5 index, a damaged users file, a store root that is a file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.stores import open_store
from process_helpers import capstack, run_capstack
from trainer_fixtures import write_experiment, write_feature_store


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


def test_nan_in_a_store_fails_verify_deep_and_stops_training_naming_the_images(data, tmp_path):
    import shutil

    import lmdb
    import numpy as np

    from pipeline.features.stores import open_store
    from pipeline.features.stores.lmdb import _record_key, encode_record

    root, prepared, grid, _ = data
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
    root, prepared, _, _ = data
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


def test_an_hdf5_store_with_a_flipped_bit_in_its_index_is_named_by_plain_verify(data,
                                                                                 tmp_path):
    import numpy as np

    root, prepared, _, _ = data
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


@pytest.mark.parametrize("damage", ['{"stage": "x"}', "[1, 2]", "not json", "[" * 100_000])
def test_a_damaged_users_file_neither_breaks_the_listing_nor_the_reuse_of_a_store(tmp_path,
                                                                                   damage):
    write_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, n_test=1, seed=0, size=32)
    args = ("extract-grid", "shapes/dataset_shapes.json", "shapes", "--backbone", "resnet18",
            "--weights", "random", "--image-size", "64", "--workers", "0", "--features-root",
            "features")
    assert run_capstack(*args, cwd=tmp_path).returncode == 0
    store = next((tmp_path / "features").glob("grid-*.lmdb")).relative_to(tmp_path)
    users = store.with_name(store.name + ".users.json")  # named from the workdir, as given
    (tmp_path / users).write_text(damage)
    listing = run_capstack("stores", "--features-root", "features", cwd=tmp_path)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    assert f"users unknown: {users}: damaged (" in listing.stdout, listing.stdout
    reused = run_capstack(*args, cwd=tmp_path)
    assert reused.returncode == 0 and "Traceback" not in reused.stderr, reused.stderr
    assert f"moved to {users}.damaged" in reused.stderr
    assert json.loads((tmp_path / users).read_text()) == [{"stage": "", "pointer": ""}]
    assert (tmp_path / f"{users}.damaged").read_text() == damage


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
