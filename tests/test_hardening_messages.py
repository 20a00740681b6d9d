"""What used to end in a traceback ends in a line naming the file, the setting or the box.

Real files, and real processes where the command line is what is checked.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from process_helpers import run_capstack
from trainer_fixtures import make_prepared, write_experiment, write_feature_store


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("messages")
    _, prepared = make_prepared(root)
    grid = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    return root, prepared, grid


def last_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


# -- float16 on a CPU, and sizes no machine holds ---------------------------------------------

@pytest.mark.parametrize("decoder", ["show_tell", "lstm3"])
def test_float16_on_a_cpu_with_an_lstm_decoder_is_refused_before_the_first_step(data, tmp_path,
                                                                                decoder):
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder=decoder, captions=prepared,
                           features=[grid], epochs=1, amp="float16", device="cpu")
    result = run_capstack("train", exp, "--out", "run", cwd=tmp_path)
    assert result.returncode == 1
    assert last_line(result) == (
        f"Error: train.amp: float16 on a CPU cannot run the {decoder} decoder: torch's nn.LSTM "
        f"has no float16 kernel on a CPU; use bfloat16 or off there, or float16 on CUDA")
    assert not (tmp_path / "run").exists()


def test_a_decoder_no_memory_here_holds_is_refused_naming_its_setting(data, tmp_path):
    from trainer.training.fits import device_memory

    import torch

    if (device_memory(torch.device("cpu")) or 0) > 140e9:
        pytest.skip("this machine holds a show_tell of 17 billion parameters")
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1, device="cpu")
    result = run_capstack("train", exp, "--out", "run", "--set", "decoder.hidden=65536",
                          cwd=tmp_path)
    assert result.returncode == 1
    line = last_line(result)
    assert line.startswith("Error: decoder.hidden: 65536 makes the show_tell decoder 17.2 "
                           "billion parameters, whose float32 weights and gradients alone need "
                           "137.") and line.endswith("; choose a smaller decoder.hidden"), line


def test_a_depth_past_any_paper_is_refused_when_the_file_is_read(data, tmp_path):
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="transformer", captions=prepared,
                           features=[grid], epochs=1)
    result = run_capstack("train", exp, "--out", "run", "--set", "decoder.layers=65536",
                          cwd=tmp_path, timeout=60)  # building 65536 layers took minutes
    assert result.returncode == 1
    assert last_line(result) == f"Error: {exp}: decoder.layers: must be from 1 to 100, got 65536"


# -- boxes ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("boxes") / "shapes"
    write_shapes_dataset(root, n_train=6, n_val=1, n_test=2, seed=3, size=64)
    return root, json.loads((root / "dataset_shapes.json").read_text())


def with_image_1(shapes, tmp_path: Path, change) -> Path:
    _, data = shapes
    data = copy.deepcopy(data)
    change(data["images"][1])
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(data))
    return path


def unlabel(image: dict) -> None:
    image["boxes"] = [{"box": b["box"]} for b in image["boxes"]]


@pytest.mark.parametrize("change", [lambda im: im.update(boxes=[]), unlabel],
                         ids=["no boxes", "no labelled box"])
def test_an_image_without_labelled_boxes_is_left_out_of_a_detectors_training(shapes, tmp_path,
                                                                            change):
    """Was: IndexError: index is out of bounds for dimension with size 0."""
    from pipeline.features.detectors.training import DetectorTraining, train_detector

    root, _ = shapes
    dataset = with_image_1(shapes, tmp_path, change)
    cfg = DetectorTraining(label_key="shape", attribute_key="color", epochs=1, batch_size=3,
                           image_size=64, proposals=20, train_proposals=40, rois=8)
    result = train_detector(dataset, root, tmp_path / "d.pth", cfg, progress=False)
    assert result["without_boxes"] == 1 and (tmp_path / "d.pth").is_file()


@pytest.mark.parametrize("change, problem", [
    (lambda im: im.update(boxes="abc"), ".boxes: expected a list of boxes ([x1, y1, x2, y2], "
                                        "or {\"box\": [...], ...} with its labels), got 'abc'"),
    (lambda im: im.update(boxes=None), ".boxes: expected a list of boxes ([x1, y1, x2, y2], "
                                       "or {\"box\": [...], ...} with its labels), got None"),
    (lambda im: im["boxes"][0].update(shape=["a"]), ".boxes[0].shape: expected a name, got "
                                                    "['a']"),
    (lambda im: im["boxes"][0].update(box=[1000, 1000, 2000, 2000]),
     ".boxes[0]: [1000.0, 1000.0, 2000.0, 2000.0] lies wholly outside the image (64x64 "
     "pixels)"),
], ids=["a string", "null", "a list as a label", "wholly outside"])
def test_boxes_a_training_cannot_use_are_named(shapes, tmp_path, change, problem):
    """Was: TypeError ('NoneType' object is not iterable, unhashable type: 'list'), a string's
    letters read as boxes, ValueError: Coordinate 'right' is less than 'left'."""
    from pipeline.demo.backbone import BackboneTraining, train_backbone
    from pipeline.features.detectors.training import DetectorTraining, train_detector

    root, _ = shapes
    dataset = with_image_1(shapes, tmp_path, change)
    cfg = DetectorTraining(label_key="shape", attribute_key="color", epochs=1, batch_size=3,
                           image_size=64, proposals=20, train_proposals=40, rois=8)
    for train in (lambda: train_detector(dataset, root, tmp_path / "d.pth", cfg,
                                         progress=False),
                  lambda: train_backbone(dataset, root, tmp_path / "b.pth",
                                         BackboneTraining(epochs=1, crop_size=16))):
        with pytest.raises(CapstackError) as refused:
            train()
        assert str(refused.value) == f"{dataset}: images[1] (imgid 1){problem}"
    assert not (tmp_path / "d.pth").exists() and not (tmp_path / "b.pth").exists()


def test_a_given_box_wholly_outside_its_image_is_refused(shapes, tmp_path):
    root, _ = shapes
    dataset = with_image_1(shapes, tmp_path,
                           lambda im: im["boxes"][0].update(box=[100, 10, 120, 30]))
    result = run_capstack("extract-regions", dataset, root, "--arch", "c5", "--backbone",
                          "resnet18", "--weights", "random", "--boxes", "given", "--min-size",
                          64, "--max-size", 64, "--workers", 0, "--features-root",
                          tmp_path / "features", cwd=tmp_path)
    assert result.returncode == 1
    assert last_line(result) == (f"Error: {dataset}: image 1: boxes[0]: [100.0, 10.0, 120.0, "
                                 f"30.0] lies wholly outside the image (64x64 pixels)")


# -- damaged files beside a run, a store, a reward -------------------------------------------

def test_a_resume_drops_a_damaged_log_line_saying_so(data, tmp_path):
    _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    assert run_capstack("train", exp, "--out", "run", cwd=tmp_path).returncode == 0
    log = tmp_path / "run" / "metrics.jsonl"
    before = log.read_text()
    with open(log, "a") as f:
        f.write('{"kind": "train", "step": 1, "lo\n[1, 2]\n')  # half a line, then not an entry
    resumed = run_capstack("train", exp, "--out", "run", "--set", "train.epochs=2",
                           cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr  # was: json.JSONDecodeError
    lines = len(before.splitlines())
    assert f"run/metrics.jsonl: lines {lines + 1}, {lines + 2} are no log entry; dropped (the " \
        f"log as it was is kept as run/metrics.jsonl.damaged)" in resumed.stderr, resumed.stderr
    assert (tmp_path / "run" / "metrics.jsonl.damaged").read_text().startswith(before)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert max(e["epoch"] for e in entries if e["kind"] == "val") == 1  # the second epoch's


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


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def cider_cache_damages(good: Path) -> dict[str, tuple[bytes, str]]:
    raw = good.read_bytes()
    with np.load(good) as loaded:
        arrays = {k: loaded[k] for k in loaded.files}
    header = json.loads(arrays["header"].tobytes())
    no_words = np.frombuffer(json.dumps({k: v for k, v in header.items() if k != "words"})
                             .encode(), np.uint8)
    return {
        "text": (b"not a cache\n", "not a CIDEr-D cache (not an .npz file)"),
        "a pickle": (pickle.dumps({"a": 1}), "not a CIDEr-D cache (not an .npz file)"),
        "truncated": (raw[:len(raw) // 2], "not a CIDEr-D cache (File is not a zip file)"),
        "objects": (npz(**{**arrays, "df": np.array([{}], dtype=object)}),
                    "not a CIDEr-D cache (it holds pickled Python objects, which capstack "
                    "never loads)"),
        "no words": (npz(**{**arrays, "header": no_words}),
                     "a damaged CIDEr-D cache (header.words: expected a list of words)"),
        "no df": (npz(**{k: v for k, v in arrays.items() if k != "df"}),
                  "a damaged CIDEr-D cache (expected the arrays df, "),
        "short df": (npz(**{**arrays, "df": arrays["df"][:-3]}),
                     "a damaged CIDEr-D cache (its arrays disagree in length)"),
    }


def test_a_damaged_cider_cache_is_named_and_never_suggests_allow_pickle(data, tmp_path):
    from trainer.rewards.cider import CiderD
    from trainer.rewards.cider_cache import build_cache

    root, prepared, grid = data
    good = tmp_path / "good.npz"
    build_cache(prepared, "train", good)
    for name, (content, problem) in cider_cache_damages(good).items():
        path = tmp_path / f"{name}.npz"
        path.write_bytes(content)
        with pytest.raises(CapstackError) as refused:
            CiderD.load(path)
        message = str(refused.value)
        assert message.startswith(f"{path}: {problem}") and "allow_pickle" not in message \
            and message.endswith("; rebuild it: capstack cider-cache"), (name, message)
    assert zipfile.is_zipfile(good)
    damaged = tmp_path / "truncated.npz"
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1,
                           objective={"name": "scst", "reward": {"name": "cider-d",
                                                                 "cache": str(damaged)}})
    result = run_capstack("train", exp, "--out", "run", cwd=tmp_path)
    assert result.returncode == 1 and last_line(result).startswith(
        f"Error: {damaged}: not a CIDEr-D cache (File is not a zip file)")
    assert os.path.getsize(damaged) > 0
