"""Weights, checkpoints and prepared captions that do not fit (issue 31, item 10).

The repros of a hostile probe: weights of another backbone, a list saved as weights, a
tensorless state_dict, an edited checkpoint without a checksum, a damaged captions.h5. Each is
refused with one line naming the file and what does not fit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch

from pipeline.captions.prepare import prepare_captions
from pipeline.captions.prepared import CHECKSUMS, load_captions
from pipeline.core.errors import CapstackError
from pipeline.vision.backbones import Weights, build_resnet, load_resnet
from trainer.checkpoint import FORMAT, load_checkpoint

CAPSTACK = str(Path(sys.executable).with_name("capstack"))  # the installed entry point
V1 = Path(__file__).parent / "data" / "checkpoint_v1" / "best.pt"  # first format, no checksum


def capstack(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CAPSTACK, *map(str, args)], cwd=cwd, capture_output=True, text=True)


def refused_in_one_line(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- backbone weights ------------------------------------------------------------------------

def test_weights_of_another_backbone_name_the_first_key_and_both_shapes(tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(build_resnet("resnet18").state_dict(), path)
    with pytest.raises(CapstackError) as refused:
        load_resnet("resnet50", Weights(str(path), "md5"))
    assert str(refused.value).startswith(
        f"{path}: does not fit resnet50: shape mismatch (file vs model) "
        f"layer1.0.conv1.weight [64, 64, 3, 3] vs [64, 64, 1, 1]")
    assert str(refused.value).endswith("(weights of another backbone?)")


def test_a_smaller_resnet_of_the_same_blocks_names_the_missing_keys(tmp_path):
    path = tmp_path / "resnet10.pth"
    torch.save(build_resnet("resnet10").state_dict(), path)
    with pytest.raises(CapstackError, match=rf"{path}: does not fit resnet18: missing keys "
                                            r"layer1\.1\.conv1\.weight"):
        load_resnet("resnet18", Weights(str(path), "md5"))


@pytest.mark.parametrize("saved, message", [
    ([1, 2], "not a state_dict (it holds a list; expected a dict of tensors)"),
    ({"fc.weight": 3}, "fc.weight is an int, not a tensor"),
    ({"conv1.weight": "weights"}, "conv1.weight is a str, not a tensor"),
    ({"model": {"fc.bias": None}}, "fc.bias is a NoneType, not a tensor"),
    ({1: torch.zeros(2)}, "a key is an int, not a name"),
])
def test_weights_that_are_not_a_dict_of_tensors_are_refused(tmp_path, saved, message):
    path = tmp_path / "weights.pth"
    torch.save(saved, path)
    with pytest.raises(CapstackError) as refused:
        load_resnet("resnet18", Weights(str(path), "md5"))
    assert str(refused.value) == f"{path}: {message}"


def test_a_zero_dim_fc_weight_is_a_shape_mismatch(tmp_path):
    state = build_resnet("resnet18").state_dict()
    state["fc.weight"] = torch.tensor(3.0)
    path = tmp_path / "fc.pth"
    torch.save(state, path)
    with pytest.raises(CapstackError, match=r"shape mismatch \(file vs model\) fc\.weight \[\] "
                                            r"vs \[1000, 512\]"):
        load_resnet("resnet18", Weights(str(path), "md5"))


def test_weights_without_fc_or_with_another_class_count_still_load(tmp_path):
    state = {k: v for k, v in build_resnet("resnet18").state_dict().items()
             if not k.startswith("fc.")}
    path = tmp_path / "body.pth"
    torch.save(state, path)
    assert load_resnet("resnet18", Weights(str(path), "md5")).fc.out_features == 1000
    torch.save(build_resnet("resnet18", num_classes=7).state_dict(), path)
    assert load_resnet("resnet18", Weights(str(path), "md5")).fc.out_features == 7


@pytest.mark.slow  # a capstack process
def test_extract_grid_with_weights_of_another_backbone_says_so_in_one_line(tmp_path):
    from pipeline.demo.shapes import write_shapes_dataset

    write_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, n_test=1, seed=0, size=32)
    weights = tmp_path / "resnet18.pth"
    torch.save(build_resnet("resnet18").state_dict(), weights)
    result = capstack("extract-grid", "shapes/dataset_shapes.json", "shapes",
                      "--backbone", "resnet50", "--weights", weights, "--image-size", "64",
                      "--grid", "2", "--workers", "0", "--features-root", tmp_path / "features",
                      cwd=tmp_path)
    refused_in_one_line(result, f"{weights}: does not fit resnet50: shape mismatch (file vs "
                                f"model) layer1.0.conv1.weight [64, 64, 3, 3] vs [64, 64, 1, 1]")


# -- checkpoints without a checksum, edited ---------------------------------------------------

def edited(tmp_path: Path, edit, second_format: bool = False) -> Path:
    """The first-format checkpoint (no checksum), or the same in the second format saved
    without a checksum (as capstack did before checksums), after ``edit(payload)``."""
    if second_format:
        payload = load_checkpoint(V1)
        payload.pop("path")
        assert payload["format"] == FORMAT
    else:
        payload = torch.load(V1, map_location="cpu", weights_only=True)
    edit(payload)
    path = tmp_path / "ckpt.pt"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pickling a deeply nested value recurses
    try:
        torch.save(payload, path)
    finally:
        sys.setrecursionlimit(limit)
    return path


def nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_unedited_checkpoints_without_a_checksum_still_load(tmp_path):
    for second in (False, True):
        ckpt = load_checkpoint(edited(tmp_path, lambda p: None, second))
        assert ckpt["format"] == FORMAT and ckpt["identity"]["decoder"]["name"] == "show_tell"


@pytest.mark.parametrize("second", [False, True])
@pytest.mark.parametrize("edit, message", [
    (lambda p: p.pop("vocab"), "no 'vocab' (not a capstack checkpoint, or edited)"),
    (lambda p: p.pop("model"), "no 'model' (not a capstack checkpoint, or edited)"),
    (lambda p: p.update(feature_dim="16"), "feature_dim is a str, not an int (edited?)"),
    (lambda p: p.update(stores={}), "stores is a dict, not a list (edited?)"),
    (lambda p: p["stores"][0].pop("meta"), "no 'stores[0].meta' (not a capstack checkpoint, "
                                           "or edited)"),
    (lambda p: p["model"].update({"image_embed.0.weight": torch.zeros(3, 3)}),
     "model: does not fit the show_tell decoder its experiment describes: shape mismatch (file "
     "vs model) image_embed.0.weight [3, 3] vs [16, 16] (edited, or saved by a capstack whose "
     "decoder kept other weights?)"),
    (lambda p: p["model"].pop("image_embed.1.num_batches_tracked"),
     "model: does not fit the show_tell decoder its experiment describes: missing keys "
     "image_embed.1.num_batches_tracked"),
    (lambda p: p["model"].update({"image_embed.0.weight": "w"}),
     "model: image_embed.0.weight is a str, not a tensor"),
    (lambda p: p.update(feature_dim=32), "model: does not fit the show_tell decoder its "
                                         "experiment describes: shape mismatch"),
    (lambda p: p["vocab"]["itow"].pop(), "vocab: its words are not those of identity.vocab"),
    (lambda p: p["vocab"]["itow"].__setitem__(9, "zebra"),
     "vocab: its words are not those of identity.vocab (md5"),
    (lambda p: p["experiment"].update(name=nested(2000)),
     "experiment.name nests more than 32 levels deep (edited?)"),
])
def test_an_edited_checkpoint_without_a_checksum_is_refused_naming_the_field(
        tmp_path, second, edit, message):
    path = edited(tmp_path, edit, second)
    with pytest.raises(CapstackError) as refused:
        load_checkpoint(path)
    assert str(refused.value).startswith(f"{path}: {message}"), str(refused.value)


def test_weights_of_a_layout_the_decoder_converts_on_load_still_fit(tmp_path):
    """top_down's attention LSTM was one nn.LSTMCell: its weights load, converted."""
    from trainer.config import experiment_from_dict
    from trainer.decoders import build_decoder
    from trainer.modules.parts_lstm import PartsLSTMCell

    def old_top_down(payload):
        payload["experiment"]["decoder"] = {"name": "top_down", "embed": 8, "hidden": 8,
                                            "att_hidden": 4}
        config = experiment_from_dict(payload["experiment"], "test")
        model = build_decoder("top_down", config.decoder.config, len(payload["vocab"]["itow"]),
                              payload["feature_dim"])
        state = model.state_dict()
        for name, cell in model.named_modules():
            if not isinstance(cell, PartsLSTMCell):
                continue
            at = f"{name}."
            *steps, weight_hh = state.pop(at + "step_weight").split(
                [cell.parts[p] for p in cell.step_parts] + [cell.hidden_size], 1)
            blocks = dict(zip(cell.step_parts, steps))
            blocks.update({p: state.pop(f"{at}ahead.{p}") for p in cell.ahead})
            state[at + "weight_ih"] = torch.cat([blocks[p] for p in cell.parts], 1)
            state[at + "weight_hh"] = weight_hh
            state[at + "bias_ih"] = state.pop(at + "bias")
            state[at + "bias_hh"] = torch.zeros_like(state[at + "bias_ih"])
        assert any(key.endswith("weight_ih") for key in state)
        payload["model"] = state

    ckpt = load_checkpoint(edited(tmp_path, old_top_down, second_format=True))
    assert any(key.endswith("weight_ih") for key in ckpt["model"])


def test_an_edited_first_format_identity_is_refused_naming_the_field(tmp_path):
    path = edited(tmp_path, lambda p: p["identity"].pop("decoder_config"))
    with pytest.raises(CapstackError, match=rf"{path}: no 'identity.decoder_config' \(not a "
                                            r"capstack checkpoint, or edited\)"):
        load_checkpoint(path)
    path = edited(tmp_path, lambda p: p["identity"]["stores"].append(7))
    with pytest.raises(CapstackError, match=rf"{path}: identity.stores\[1\] is an int, not a "
                                            r"dict \(edited\?\)"):
        load_checkpoint(path)


def test_a_deeply_nested_value_is_refused_before_its_checksum_is_computed(tmp_path):
    path = edited(tmp_path, lambda p: p.update(content_sha256="0" * 64, extra=nested(2000)),
                  second_format=True)
    with pytest.raises(CapstackError, match=rf"{path}: extra nests more than 32 levels deep"):
        load_checkpoint(path)


class Model(torch.nn.Module):
    """What ``torch.save(model)`` pickles: the module itself, not its state_dict."""


def test_a_checkpoint_of_pickled_objects_is_named_in_one_line_never_advising_weights_only(
        tmp_path):
    """torch's refusal was passed on whole: six lines advising weights_only=False, which runs
    whatever the file says; for a run, and for a file given as an ensemble member."""
    from trainer.evaluation.ensembles import load_ensemble

    for saved, named in ((Model(), "test_fit.Model"),
                         ({"format": FORMAT, "experiment": argparse.Namespace(name="x")},
                          "argparse.Namespace")):
        path = tmp_path / "model.pt"
        torch.save(saved, path)
        for load in (load_checkpoint, lambda p: load_ensemble([V1, p])):
            with pytest.raises(CapstackError) as refused:
                load(path)
            said = str(refused.value)
            assert said == (f"{path}: holds objects capstack does not load ({named}): not a "
                            f"plain tensor checkpoint (capstack reads tensors and plain data, "
                            f"and runs nothing a file names)"), said
    for garbage, why in ((b"not a zip" * 10, "not a file torch.save wrote"), (b"", "EOFError")):
        path.write_bytes(garbage)
        with pytest.raises(CapstackError) as refused:
            load_checkpoint(path)
        assert str(refused.value) == f"{path}: not a readable checkpoint ({why})"


def test_a_fifo_where_a_checkpoint_is_read_is_named_not_called_missing(tmp_path):
    from trainer.config import experiment_from_dict
    from trainer.training.build import starting_checkpoint

    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "best.pt")
    os.mkfifo(tmp_path / "last.pt")
    for given, fifo in ((tmp_path / "run", tmp_path / "run" / "best.pt"),
                        (tmp_path / "last.pt", tmp_path / "last.pt")):
        with pytest.raises(CapstackError, match=rf"^{fifo}: not a regular file \(a FIFO\), "
                                                r"never read \(expected a checkpoint\)$"):
            load_checkpoint(given)
        experiment = {**load_checkpoint(V1)["experiment"]}
        experiment["train"] = {**experiment["train"], "init_from": str(given)}
        with pytest.raises(CapstackError, match=rf"^{fifo}: not a regular file \(a FIFO\)"):
            starting_checkpoint(experiment_from_dict(experiment, "test"))
    with pytest.raises(CapstackError, match=rf"^{tmp_path}/gone.pt: checkpoint not found$"):
        load_checkpoint(tmp_path / "gone.pt")


@pytest.mark.slow  # a capstack process
def test_evaluate_on_a_checkpoint_without_its_vocabulary_says_so_in_one_line(tmp_path):
    path = edited(tmp_path, lambda p: p.pop("vocab"))
    result = capstack("evaluate", path, "--out", tmp_path / "eval", cwd=tmp_path)
    refused_in_one_line(result, f"{path}: no 'vocab' (not a capstack checkpoint, or edited)")


# -- prepared captions -----------------------------------------------------------------------

@pytest.fixture
def prepared(tiny_dataset_json, tmp_path) -> Path:
    out = tmp_path / "prepared"
    prepare_captions(tiny_dataset_json, out, min_count=1)
    return out


def edit_h5(path: Path, name: str, index, value) -> None:
    with h5py.File(path, "r+") as f:
        data = f[name][()]
        data[index] = value
        del f[name]
        f.create_dataset(name, data=data)


def test_prepare_records_checksums_of_what_it_wrote(prepared):
    recorded = json.loads((prepared / CHECKSUMS).read_text())["md5"]
    assert set(recorded) == {"vocab.json", "captions.h5", "summary.json",
                             *(f"{kind}_{split}.json" for kind in ("refs", "images")
                               for split in ("train", "val", "test"))}
    assert len(load_captions(prepared).image_ids) == 4


def test_a_damaged_file_of_a_prepared_folder_is_named(prepared):
    edit_h5(prepared / "captions.h5", "labels", (1, 0), 9000)
    with pytest.raises(CapstackError) as refused:
        load_captions(prepared)
    assert str(refused.value).startswith(
        f"{prepared / 'captions.h5'}: damaged: its content does not match the md5 that "
        f"`capstack prepare` recorded in {CHECKSUMS}")


def test_an_edited_vocabulary_or_a_lost_file_of_a_prepared_folder_is_named(prepared):
    vocab = prepared / "vocab.json"
    vocab.write_text(vocab.read_text().replace("circle", "circus"))
    with pytest.raises(CapstackError, match=f"{vocab}: damaged"):
        load_captions(prepared)
    (prepared / "refs_val.json").unlink()
    with pytest.raises(CapstackError, match=f"{prepared / 'refs_val.json'}: missing, though "
                                            f"{CHECKSUMS} lists it"):
        load_captions(prepared)


def test_a_damaged_checksum_file_is_named(prepared):
    (prepared / CHECKSUMS).write_text('{"md5": {"../vocab.json": "x"}}')
    with pytest.raises(CapstackError, match=f"{prepared / CHECKSUMS}: damaged"):
        load_captions(prepared)
    (prepared / CHECKSUMS).write_text("{")
    with pytest.raises(CapstackError, match=f"{prepared / CHECKSUMS}: damaged"):
        load_captions(prepared)


def test_a_prepared_folder_from_before_checksums_still_loads(prepared):
    (prepared / CHECKSUMS).unlink()
    captions = load_captions(prepared)
    assert captions.labels.shape[0] == 8 and len(captions.vocab) > 4


@pytest.mark.parametrize("name, index, value, message", [
    ("labels", (1, 0), 9000, "labels[1] holds word id 9000, the vocabulary has {V} words"),
    ("labels", (5, 1), -3, "labels[5] holds word id -3, the vocabulary has {V} words"),
    ("label_end", 3, 99, "label_end[3] is 99, past the 8 caption rows"),
    ("label_start", 2, 7, "label_start[2] is 7, after label_end[2] (6)"),
    ("label_start", 0, -1, "label_start[0] is -1, before the first caption row"),
    ("lengths", 2, 40, "lengths[2] is 40, outside 0..16 (the labels' width)"),
    ("split", 1, 7, "split[1] is 7, not a split code (0 train, 1 val, 2 test)"),
])
def test_a_captions_file_of_an_old_prepared_folder_that_does_not_fit_is_refused(
        prepared, name, index, value, message):
    (prepared / CHECKSUMS).unlink()  # as written by a capstack before checksums
    vocab_size = len(load_captions(prepared).vocab)
    edit_h5(prepared / "captions.h5", name, index, value)
    with pytest.raises(CapstackError) as refused:
        load_captions(prepared)
    assert str(refused.value) == f"{prepared / 'captions.h5'}: {message.format(V=vocab_size)}"


def test_arrays_of_other_lengths_are_refused(prepared):
    (prepared / CHECKSUMS).unlink()
    with h5py.File(prepared / "captions.h5", "r+") as f:
        lengths = f["lengths"][()]
        del f["lengths"]
        f.create_dataset("lengths", data=lengths[:5])
    with pytest.raises(CapstackError, match=r"captions.h5: lengths has 5 entries, labels has 8 "
                                            r"rows"):
        load_captions(prepared)


@pytest.mark.slow  # a capstack process
def test_cider_cache_on_a_damaged_captions_file_says_so_in_one_line(prepared, tmp_path):
    (prepared / CHECKSUMS).unlink()
    edit_h5(prepared / "captions.h5", "label_end", 3, 99)
    result = capstack("cider-cache", prepared, "--out", tmp_path / "df.npz", cwd=tmp_path)
    refused_in_one_line(result, f"{prepared / 'captions.h5'}: label_end[3] is 99, past the 8 "
                                f"caption rows")
