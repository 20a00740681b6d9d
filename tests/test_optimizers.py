"""The optimiser as a component: each registered one builds with its settings and resumes exactly;
the old ``train.betas`` / ``train.weight_decay`` still read, with a warning naming the new key."""

from __future__ import annotations

import warnings

import pytest
import torch
import yaml

from pipeline.core.errors import CapstackError
from trainer.checkpoint import load_checkpoint
from trainer.config import load_experiment
from trainer.optimizers import OPTIMIZERS
from trainer.train import train
from trainer.training.build import build
from trainer_fixtures import logged, write_experiment


@pytest.fixture
def experiment(small_data, tmp_path):
    prepared, store = small_data
    return write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[store], epochs=3, log_every=1)


@pytest.mark.parametrize("name, settings, torch_class, expected", [
    ("adam", "{betas: [0.8, 0.99], eps: 1.0e-6, weight_decay: 0.01}", torch.optim.Adam,
     {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01}),
    ("adamax", "{betas: [0.9, 0.98]}", torch.optim.Adamax, {"betas": (0.9, 0.98)}),
    ("rmsprop", "{alpha: 0.9, momentum: 0.5, centered: true}", torch.optim.RMSprop,
     {"alpha": 0.9, "momentum": 0.5, "centered": True}),
])
def test_each_optimiser_is_built_with_its_settings_over_the_decoders_groups(
        experiment, tmp_path, name, settings, torch_class, expected):
    config = load_experiment(experiment, [f"train.optimizer={settings[:-1]}, name: {name}}}",
                                          "train.lr=0.003"])
    run = build(config, tmp_path / "run")
    assert type(run.optimizer) is torch_class
    group = run.optimizer.param_groups[0]
    assert group["lr"] == 0.003 and {k: group[k] for k in expected} == expected
    assert {g["name"] for g in run.optimizer.param_groups} == set(run.model.parameter_groups())
    assert config.to_dict()["train"]["optimizer"]["name"] == name


def test_adam_is_the_default_and_an_unknown_optimiser_is_named_with_the_registrys_list(
        experiment):
    config = load_experiment(experiment)
    assert config.train.optimizer.name == "adam" and config.train.optimizer.config.betas == [
        0.9, 0.999]
    with pytest.raises(CapstackError) as error:
        load_experiment(experiment, ["train.optimizer.name=lamb"])
    assert str(error.value) == (f"{experiment}: train.optimizer.name: unknown optimiser 'lamb' "
                                f"(choose {', '.join(OPTIMIZERS)})")
    with pytest.raises(CapstackError, match="train.optimizer.betas: unknown key 'betas'"):
        load_experiment(experiment, ["train.optimizer={name: rmsprop, betas: [0.9, 0.9]}"])


@pytest.mark.slow  # three trainings
def test_a_run_on_rmsprop_resumes_exactly(experiment, tmp_path):
    """Its momentum and square averages are checkpointed and restored: 1 epoch, then 2 more,
    is the 3 epochs of one run, loss for loss and moment for moment."""
    rmsprop = ["train.optimizer={name: rmsprop, alpha: 0.9, momentum: 0.9}", "train.lr=0.002"]
    train(load_experiment(experiment, rmsprop), tmp_path / "whole", progress=False)
    train(load_experiment(experiment, rmsprop + ["train.epochs=1"]), tmp_path / "split",
          progress=False)
    resumed = train(load_experiment(experiment, rmsprop), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (1, 0)
    assert logged(tmp_path / "split", "loss") == logged(tmp_path / "whole", "loss")
    whole, split = (load_checkpoint(tmp_path / run / "last.pt")["optimizer"]
                    for run in ("whole", "split"))
    for key in ("square_avg", "momentum_buffer"):
        assert torch.equal(whole["state"][0][key], split["state"][0][key]), key
    with pytest.raises(CapstackError, match=r"train.optimizer: the run was trained with"):
        train(load_experiment(experiment, ["train.epochs=4", "train.lr=0.002"]),
              tmp_path / "split", progress=False)  # Adam now: another run


def test_the_old_adam_keys_read_with_a_warning_naming_the_new_ones(small_data, tmp_path):
    prepared, store = small_data
    path = write_experiment(tmp_path / "old.yaml", decoder="show_tell", captions=prepared,
                            features=[store], betas=[0.8, 0.9], weight_decay=0.001)
    with pytest.warns(FutureWarning,
                      match="train.optimizer.betas and train.optimizer.weight_decay"):
        config = load_experiment(path)
    assert config.train.optimizer.name == "adam"
    assert (config.train.optimizer.config.betas, config.train.optimizer.config.weight_decay) == (
        [0.8, 0.9], 0.001)
    with pytest.warns(FutureWarning, match="train.optimizer"):
        config = load_experiment(path, ["train.betas=[0.7, 0.9]"])
    assert config.train.optimizer.config.betas == [0.7, 0.9]
    both = yaml.safe_load(path.read_text())
    both["train"]["optimizer"] = {"name": "adamax"}
    path.write_text(yaml.safe_dump(both))
    with warnings.catch_warnings(), pytest.raises(CapstackError,
                                                  match="train.optimizer names the optimiser"):
        warnings.simplefilter("ignore", FutureWarning)
        load_experiment(path)
