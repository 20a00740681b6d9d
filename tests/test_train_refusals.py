"""Training's refusals of settings it cannot run, each named before the first step: float16 on a
CPU, sizes no memory holds, depths past any paper, an empty validation split, bad experiment
values and devices, reward mixes, --set mappings, YAML alias bombs in experiments."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.demo.shapes import write_shapes_dataset
from process_helpers import alias_bomb, capstack, last_line, limited, run_capstack
from trainer_fixtures import make_prepared
from trainer_fixtures import write_experiment, write_feature_store


@pytest.mark.parametrize("decoder", ["show_tell", "lstm3"])
def test_float16_on_a_cpu_with_an_lstm_decoder_is_refused_before_the_first_step(data, tmp_path,
                                                                                decoder):
    _, prepared, grid, _ = data
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
    _, prepared, grid, _ = data
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
    _, prepared, grid, _ = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="transformer", captions=prepared,
                           features=[grid], epochs=1)
    result = run_capstack("train", exp, "--out", "run", "--set", "decoder.layers=65536",
                          cwd=tmp_path, timeout=60)  # building 65536 layers took minutes
    assert result.returncode == 1
    assert last_line(result) == f"Error: {exp}: decoder.layers: must be from 1 to 100, got 65536"


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


@pytest.mark.parametrize("setting, message", [
    ("decoder.dropout=1.5", "exp.yaml: decoder.dropout: a probability, must be below 1, got 1.5"),
    ("decoder.embed=-4", "exp.yaml: decoder.embed: must be from 1 to 65536, got -4"),
    ("train.device=quantum", "exp.yaml: train.device: unknown device 'quantum'"),
    ("train.lr=[", "--set 'train.lr=[': the value is not valid YAML"),
])
def test_a_bad_experiment_value_is_named_not_a_traceback(data, tmp_path, setting, message):
    _, prepared, grid, _ = data
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


def test_a_reward_mix_of_weights_0_is_refused(data, tmp_path):
    _, prepared, grid, _ = data
    mix = {"name": "mix", "parts": [{"name": "bleu", "weight": 0},
                                     {"name": "bleu", "n": 2, "weight": 0.0}]}
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1,
                           objective={"name": "scst", "reward": mix})
    result = run_capstack("train", exp, "--out", "run", cwd=tmp_path)
    assert result.returncode == 1  # was: a training at loss 0
    assert last_line(result) == (
        f"Error: {exp}: objective.reward.parts: every weight is 0, so every caption would score "
        f"0 and nothing be learnt; give at least one part a weight above 0")
    assert not (tmp_path / "run").exists()


def test_a_mapping_given_to_set_is_laid_over_the_files_section(data, tmp_path):
    _, prepared, grid, _ = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=2, batch_size=3)
    result = run_capstack("train", exp, "--out", "run", "--set", "train={epochs: 1}",
                          "--set", "decoder={hidden: 16}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["train"]["epochs"] == 1  # given
    assert config["train"]["lr"] == 5e-3 and config["train"]["batch_size"] == 3  # was: dropped
    assert config["decoder"]["hidden"] == 16 and config["decoder"]["embed"] == 32


@pytest.fixture
def experiment(data, tmp_path):
    _, prepared, grid, _ = data
    return write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid], epochs=1)


BOMBS = {"values": (alias_bomb(6), "more than 100000 values once its YAML aliases are "
                                   "expanded"),
         "text": (alias_bomb(4, leaf="x" * 2000), "more than 16 MiB of text once its YAML "
                                                   "aliases are expanded")}


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_an_alias_bomb_in_an_experiment_or_a_set_value_is_refused_at_once(experiment, tmp_path,
                                                                          kind):
    """425 bytes once made 2.8 GB and 580 MB of stderr; 472 bytes 22 GB."""
    bomb, message = BOMBS[kind]
    file = yaml.safe_load(experiment.read_text())
    text = yaml.safe_dump({k: v for k, v in file.items() if k != "eval"}) + \
        f"eval: {{split: {bomb}}}\n"
    (tmp_path / "bomb.yaml").write_text(text)
    assert len(text) < 30_000
    for args, where in ((("bomb.yaml",), "bomb.yaml"),
                        ((experiment, "--set", f"eval.split={bomb}"), "--set eval.split")):
        result = limited("train", *args, "--out", tmp_path / "run", cwd=tmp_path)
        assert result.returncode == 1, result.stderr[-2000:]
        assert f"{where}: {message}" in result.stderr, result.stderr[-2000:]
        assert len(result.stderr) < 2000
    assert not (tmp_path / "run").exists()


def test_an_alias_bomb_in_an_experiment_manifest_is_refused_at_once(tmp_path):
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": "capstack shapes data --train 1 --val 1 --test 1", "outs": ["data"]}}}))
    manifest = tmp_path / "exps" / "x" / "experiment.yaml"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(f"name: x\ngroup: x\nroots: [shapes]\nparams: {{seed: {alias_bomb(6)}}}\n")
    result = limited("exp", "list", cwd=tmp_path)
    # never expanded; a damaged manifest, set aside and said, that hides no other experiment
    assert result.returncode == 0, result.stderr
    assert "experiment.yaml: damaged experiment manifest (more than 100000 values once its " \
        "YAML aliases" in result.stderr
    assert not manifest.exists() and manifest.with_name("experiment.yaml.damaged").is_file()


def test_a_value_shown_in_a_message_is_bounded(experiment, tmp_path):
    from pipeline.core.errors import CapstackError
    from trainer.config import load_experiment

    listed = "[" + ", ".join(["'circle'"] * 5000) + "]"
    with pytest.raises(CapstackError) as refused:
        load_experiment(experiment, [f"eval.split={listed}"])
    assert "eval.split: expected one of train, val, test, got ['circle', " in str(refused.value)
    assert len(str(refused.value)) < 1000
