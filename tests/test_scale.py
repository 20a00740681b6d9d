"""What benchmarks/scale.py found at COCO's size, each kept fixed, and the script itself on a
tiny workload (its full run is by hand: ~20 min and ~52 GB of disk at 123k images)."""

from __future__ import annotations

import gc
import json
import pickle

import numpy as np
import pytest
import torch

import pipeline.core.pointer
from conftest import karpathy_image
from pipeline.captions.karpathy import load_karpathy
from pipeline.core.bulk import gc_paused
from pipeline.core.errors import CapstackError
from pipeline.core.pointer import MAX_POINTER_BYTES, target_of, write_pointer
from pipeline.features.stores import Record, Schema, create_writer, field, open_store
from pipeline.features.stores.schema import cast, finite, representable
from trainer.rewards.cider import sorted_unique
from scripts import load_script



# -- the stage check: a dataset json as a dep is hashed (cached), never parsed ------------

def test_a_json_larger_than_a_pointer_is_not_read_as_one(tmp_path, monkeypatch):
    store = tmp_path / "x.lmdb"
    pointer = tmp_path / "regions.json"
    write_pointer(pointer, store, "abc")
    assert target_of(pointer) == store.resolve()
    big = tmp_path / "dataset_coco.json"
    big.write_text(json.dumps({"store": "/gone", "images": ["x" * 100] * 1000}))
    assert big.stat().st_size > MAX_POINTER_BYTES
    monkeypatch.setattr(pipeline.core.pointer, "read_json",
                        lambda *a, **k: pytest.fail("a large json was parsed"))
    assert target_of(big) is None


def test_an_up_to_date_check_does_not_parse_a_large_json_dep(capstack, monkeypatch):
    data = capstack.workdir / "dataset.json"
    data.write_text(json.dumps({"images": [{"raw": "a caption " * 10}] * 1000}))
    (capstack.workdir / "stages.yaml").write_text(
        "stages:\n  s:\n    cmd: echo ok > out.txt\n    shell: true\n"
        "    deps: [dataset.json]\n    outs: [out.txt]\n")
    capstack.stage_cmd("run", "s")
    monkeypatch.setattr(pipeline.core.pointer, "read_json",
                        lambda *a, **k: pytest.fail("the dataset json was parsed"))
    assert capstack.statuses()["s"]["state"] == "up to date"


def test_the_collector_is_paused_for_a_parse_and_restored_after_it():
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        assert not gc.isenabled()
        raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before: off after
    finally:
        gc.enable()


# -- the CIDEr-D cache: unique values by sorting (numpy 2.3+'s np.unique hashes) ----------

@pytest.mark.parametrize("n", [0, 1, 7, 5000])
def test_sorted_unique_is_np_unique(n):
    values = np.random.default_rng(n).integers(-50, 2**40, n) // 3
    values[: n // 2] = values[n // 2: 2 * (n // 2)]  # duplicates
    assert np.array_equal(sorted_unique(values), np.unique(values))
    assert sorted_unique(values).dtype == values.dtype


# -- Karpathy captions: the same words, one string object per distinct word ---------------

def test_tokens_are_split_lowercased_and_shared(tmp_path):
    images = [karpathy_image(0, "train", ["A Dog  runs", "a dog"]),
              karpathy_image(1, "test", ["A DOG"])]
    images[0]["sentences"][0]["tokens"] = ["A", "Dog  runs", " "]
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"images": images}))
    dataset = load_karpathy(path)
    first, second = dataset.images[0].sentences
    assert first.tokens == ("a", "dog", "runs") and second.tokens == ("a", "dog")
    assert first.tokens[1] is second.tokens[1] is dataset.images[1].sentences[0].tokens[1]


@pytest.mark.parametrize("tokens", [["a", 3], "a dog", [None], [["a"]]])
def test_tokens_that_are_not_strings_are_refused(tmp_path, tokens):
    image = karpathy_image(0, "train", ["a dog"])
    image["sentences"][0]["tokens"] = tokens
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"images": [image]}))
    with pytest.raises(CapstackError, match=r"sentences\[0\]\.tokens: expected a list of "
                                            r"strings"):
        load_karpathy(path)


# -- store writes: float16 checked by its bits, the cast on one thread, commits flat ------

def float16_cases() -> list[np.ndarray]:
    ok = np.array([0, -0.0, 6e-8, 1, -65504, 65504], np.float16)
    bad = [np.array([1, v], np.float16) for v in (np.inf, -np.inf, np.nan)]
    payload = np.array([1, 0], np.float16)
    payload.view(np.uint16)[1] = 0x7E01  # a NaN with another payload
    return [ok, *bad, payload, ok.reshape(2, 3)[:, ::2]]  # and a strided view


def test_float16_finiteness_by_its_bits():
    for values in float16_cases():
        expected = bool(np.isfinite(values).all())
        assert finite(values) == expected
        assert representable(values, np.float16) == expected
        assert representable(values, np.float32) == expected
    assert finite(np.array([1, np.nan], np.float32)) is False
    assert not representable(np.array([1e5], np.float32), np.float16)


def test_the_cast_to_float16_leaves_torch_threads_as_they_were():
    values = np.random.default_rng(0).standard_normal((34, 2048)).astype(np.float32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert np.array_equal(cast(values, np.float16), values.astype(np.float16))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_record_twice_in_one_commit_is_written_once(tmp_path):
    schema = Schema((field("features", (4,), "float16"),))
    meta = {**schema.to_meta(), "producer": {"name": "t", "settings": {}, "about": {}},
            "fingerprint": "f", "capstack_version": "t"}
    one, two = (Record(np.full((2, 4), v, np.float32), 1, 1) for v in (1, 2))
    with create_writer(tmp_path / "s.lmdb", meta) as writer:
        writer.write([(3, one), (3, two)], [(3, "late"), (4, "gone"), (4, "again")])
        writer.write([(3, two), (5, two)], [(4, "third")])
        writer.finish()
    store = open_store(tmp_path / "s.lmdb")
    assert sorted(store.ids()) == [3, 5] and store.meta["skipped"] == {"4": "gone"}
    assert (store.get(3).features == 1).all()
    assert (pickle.loads(pickle.dumps(store)).get(5).features == 2).all()


# -- the script ---------------------------------------------------------------------------

def load_scale():
    return load_script("benchmarks/scale.py")


def test_the_synthetic_workload_is_coco_shaped():
    load_scale()  # puts benchmarks/ on the path, where its workload module lives
    import scale_parts.workload as scale

    plan = scale.split_plan(scale.COCO_IMAGES)
    assert [plan.count(s) for s in ("train", "restval", "val", "test")] == \
        [82_783, 30_504, 5_000, 5_000]
    tokens = scale.sentences(np.random.default_rng(0), 20_000, np.array(scale.word_list()))
    lengths = np.array([len(t) for t in tokens])
    assert 10 < lengths.mean() < 11 and lengths.min() == 8 and lengths.max() <= 50
    assert len(set(scale.word_list())) == scale.WORDS


@pytest.mark.slow  # ~10 processes, each importing torch
def test_the_script_runs_on_a_tiny_workload_and_leaves_nothing(tmp_path, capsys):
    scale = load_scale()
    scale.main(["--images", "30", "--images", "60", "--costs",
                "prepare,stage_edit,store_extract,batches", "--workdir", str(tmp_path),
                "--json", str(tmp_path / "figures.json")])
    out = capsys.readouterr().out
    assert "| cost | 30 | 60 | exponent |" in out
    assert "one image's content changed: stale (dep images changed)" in out
    figures = json.loads((tmp_path / "figures.json").read_text())["results"]
    assert set(figures) == {"prepare", "stage_edit", "store_extract", "batches"}
    assert all("seconds" in f and f["peak_mb"] > 0 for by_n in figures.values()
               for f in by_n.values())
    assert [p.name for p in tmp_path.iterdir()] == ["figures.json"]  # the workloads are gone
