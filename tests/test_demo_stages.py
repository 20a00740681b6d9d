"""The project's own stages.yaml: every registered approach reaches the tables, XE and RL."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainer.decoders import DECODERS

ROOT = Path(__file__).resolve().parent.parent


def stages() -> dict:
    return yaml.safe_load((ROOT / "stages.yaml").read_text())["stages"]


def test_every_registered_decoder_has_an_experiment_a_training_and_an_rl_stage():
    s = stages()
    for name in DECODERS:
        experiment = yaml.safe_load((ROOT / "configs" / "experiments" / f"{name}.yaml").read_text())
        assert experiment["name"] == name and experiment["decoder"]["name"] == name
        assert name in s["train"]["foreach"], name
        assert name in s["rl"]["foreach"], name


def test_the_tables_stage_reports_every_approach_xe_then_rl_then_adversarial():
    s = stages()
    names = list(DECODERS)
    expected = ([f"evals/{n}" for n in names] + [f"evals/{n}-rl" for n in names]
                + [f"evals/{n}-adv" for n in s["adversarial"]["foreach"]])
    assert list(s["adversarial"]["foreach"]) == ["hacap"]
    assert sorted(s["tables"]["deps"]) == sorted(expected)
    assert sorted(s["evaluate"]["foreach"]) == sorted(e.removeprefix("evals/") for e in expected)
    reported = s["tables"]["cmd"].split()
    assert [r for r in reported if r.startswith("evals/")] == s["tables"]["deps"]
