"""Issue 31, item 9: values that reached torch or numpy unchecked, now refused when read.

Every number of every config dataclass has a declared bound (trainer/config.py:
``bounded``), checked when the experiment is read; the message names the field and
the bound. The walk below fails for a number field added without one.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import CapstackError
from process_helpers import capstack
from trainer.config import Bound, ExperimentConfig, load_experiment
from trainer.decoders.base import DecoderConfig

ROOT = Path(__file__).resolve().parent.parent
CAPSTACK = str(Path(sys.executable).with_name("capstack"))  # the installed entry point


def experiment_file(folder: Path) -> Path:
    """An experiment file: nothing it names needs to exist, as nothing is opened when read."""
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump({
        "name": "exp", "decoder": {"name": "show_tell", "embed": 32, "hidden": 32},
        "data": {"captions": "prepared", "features": ["grid.lmdb"]},
        "train": {"epochs": 2}}, sort_keys=False))
    return path


SCST = ["objective.name=scst", "objective.reward={name: cider-d, cache: c.npz}"]
ADVERSARIAL = ["decoder.name=hacap", "objective.name=adversarial"]


@pytest.mark.parametrize("overrides, problem", [
    # what the probe found: a traceback from torch or numpy ...
    (["train.optimizer.betas=[2,2]"], "train.optimizer.betas[0]: must be a finite number at "
                                      "least 0 and below 1, got 2.0"),
    (["train.optimizer.weight_decay=-1"], "train.optimizer.weight_decay: must be a finite "
                                          "number, 0 or more, got -1.0"),
    (["train.optimizer={name: rmsprop, alpha: 1}"], "train.optimizer.alpha: must be a finite "
                                                    "number at least 0 and below 1, got 1.0"),
    (["train.lr=.nan"], "train.lr: must be a finite number above 0, got nan"),
    (["train.seed=-1"], "train.seed: must be from 0 to 4294967295, got -1"),
    (["train.seed=100000000000000000000000"],
     "train.seed: must be from 0 to 4294967295, got 100000000000000000000000"),
    (["data.max_regions=-1"], "data.max_regions: must be from 0 to 10000, got -1"),
    # ... or a value acted on without a word
    (["train.lr_decay_every=-1"], "train.lr_decay_every: must be from 0 to 10000, got -1"),
    (["train.checkpoint_every=-1"], "train.checkpoint_every: must be from 0 to 1000000000, got -1"),
    (["train.val_images=-1"], "train.val_images: must be from 0 to 10000000, got -1"),
    (["train.max_len=0"], "train.max_len: must be from 1 to 1000, got 0"),
    # the same bounds elsewhere: infinities, floats past any float, the other sections
    (["train.grad_clip=.inf"], "train.grad_clip: must be a finite number, 0 or more, got inf"),
    (["train.lr=1" + "0" * 400], "train.lr: must be a finite number above 0, got inf"),
    (["train.lr_decay_rate=0"], "train.lr_decay_rate: must be a finite number above 0 and at "
                                "most 1, got 0.0"),
    (["train.optimizer.betas=[0.9, 1]"], "train.optimizer.betas[1]: must be a finite number "
                                         "at least 0 and below 1, got 1.0"),
    (["eval.figures=-1"], "eval.figures: must be from 0 to 1000, got -1"),
    (["eval.beam_size=0"], "eval.beam_size: must be from 1 to 100, got 0"),
    (["objective.scheduled_sampling_max=.nan"],
     "objective.scheduled_sampling_max: must be a finite number from 0 to 1, got nan"),
    (SCST + ["objective.temperature=0"],
     "objective.temperature: must be a finite number above 0, got 0.0"),
    (ADVERSARIAL + ["objective.delta=-.inf"],
     "objective.delta: must be a finite number, 0 or more, got -inf"),
    (ADVERSARIAL + ["objective.ml_batches=-1"],
     "objective.ml_batches: must be from 0 to 1000000000, got -1"),
])
def test_a_number_out_of_its_bound_is_named_with_the_bound_when_read(tmp_path, overrides,
                                                                     problem):
    path = experiment_file(tmp_path)
    with pytest.raises(CapstackError) as error:
        load_experiment(path, overrides)
    assert str(error.value) == f"{path}: {problem}"


def test_the_cross_field_rules_still_speak_after_the_bounds(tmp_path):
    path = experiment_file(tmp_path)
    with pytest.raises(CapstackError, match="train.optimizer.betas: expected two numbers"):
        load_experiment(path, ["train.optimizer.betas=[0.5]"])
    with pytest.raises(CapstackError, match="baseline: 'mean' .* needs samples >= 2, got 1"):
        load_experiment(path, SCST + ["objective.baseline=mean", "objective.samples=1"])
    config = load_experiment(path, ["train.seed=4294967295", "train.optimizer.betas=[0, 0.999999]",
                                    "train.lr_decay_rate=1", "data.max_regions=0"])
    assert (config.train.seed, config.train.optimizer.config.betas) == (4294967295,
                                                                        [0.0, 0.999999])


@pytest.mark.slow  # capstack processes
@pytest.mark.parametrize("override, problem", [
    ("train.lr=.nan", "exp.yaml: train.lr: must be a finite number above 0, got nan"),
    ("train.seed=100000000000000000000000",
     "exp.yaml: train.seed: must be from 0 to 4294967295, got 100000000000000000000000"),
])
def test_capstack_train_refuses_in_one_line_before_any_work(tmp_path, override, problem):
    experiment_file(tmp_path)
    result = subprocess.run([CAPSTACK, "train", "exp.yaml", "--out", "run", "--set", override],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert result.stderr == f"Error: {problem}\n"
    assert not (tmp_path / "run").exists()


# -- every number has a bound ------------------------------------------------------------------

def config_classes() -> dict[str, type]:
    """Every config dataclass an experiment file fills: its sections, each registered
    component's ``Config``, and any dataclass nested in them."""
    found: dict[str, type] = {}

    def walk(name: str, cls: type) -> None:
        if cls in found.values():  # a component may hold its own kind (a mix of rewards)
            return
        found[name] = cls
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "registry" in f.metadata:
                for entry, component in f.metadata["registry"].items():
                    walk(f"{f.name}.{entry}", component.Config)
                if f.metadata.get("beside"):  # the holder's keys beside (a mix part's weight)
                    walk(f"{f.name}.beside", f.metadata["beside"])
            elif dataclasses.is_dataclass(hints[f.name]):
                walk(f.name, hints[f.name])

    walk("experiment", ExperimentConfig)
    return found


def numeric(hint) -> bool:
    """An int or float field, or a list (or optional) of them."""
    if typing.get_args(hint):
        return any(numeric(a) for a in typing.get_args(hint) if a is not type(None))
    return hint in (int, float)


def test_the_walk_finds_every_section_and_component():
    from trainer.decoders import DECODERS
    from trainer.objectives import OBJECTIVES

    found = set(config_classes().values())
    assert {cls.Config for _, cls in DECODERS.items()} <= found
    assert {cls.Config for _, cls in OBJECTIVES.items()} <= found
    assert {c for c in found if c.__name__ in ("DataConfig", "TrainConfig", "EvalConfig")} \
        and len(found) >= 3 + len(DECODERS.items()) + len(OBJECTIVES.items())


@pytest.mark.parametrize("name, cls", sorted(config_classes().items()))
def test_every_number_of_every_config_has_a_bound(name, cls):
    if issubclass(cls, DecoderConfig):  # bounds every number generically (DecoderConfig.check)
        return
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not numeric(hints[f.name]) or "registry" in f.metadata:
            continue
        bound = f.metadata.get("bound")
        assert isinstance(bound, Bound), (f"{name}.{f.name}: a number without a bound; declare "
                                          f"it with trainer.config.bounded(default, low, high)")
        if hints[f.name] is int:
            assert bound.low is not None and bound.high is not None, \
                f"{name}.{f.name}: a whole number needs both ends (low and high)"
        default = (f.default if f.default is not dataclasses.MISSING else
                   f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        for number in default if isinstance(default, list) else [default]:
            if number is not None:
                assert bound.problem(number) is None, f"{name}.{f.name}: default {number!r} " \
                                                      f"outside its own bound"


EXPERIMENTS = sorted(p for p in (ROOT / "configs").rglob("*.yaml")
                     if "stages" not in (yaml.safe_load(p.read_text()) or {}))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_every_shipped_experiment_lies_within_the_bounds(path):
    load_experiment(path)


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
