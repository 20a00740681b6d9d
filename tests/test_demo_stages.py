"""The project's own stages.yaml: every registered approach reaches the tables, XE and RL."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainer.decoders import DECODERS

ROOT = Path(__file__).resolve().parent.parent


def stages() -> dict:
    """The stages as the engine resolves them (vars and foreach spread), by name."""
    from cli import stage_commands
    from pipeline.engine.stagefile import load_stages_file

    return load_stages_file(ROOT / "stages.yaml", stage_commands()).stages


def test_every_registered_decoder_has_an_experiment_a_training_and_an_rl_stage():
    s = stages()
    for name in DECODERS:
        experiment = yaml.safe_load((ROOT / "configs" / "experiments" / f"{name}.yaml").read_text())
        assert experiment["name"] == name and experiment["decoder"]["name"] == name
        assert f"train@{name}" in s and f"rl@{name}" in s, name
        assert s[f"train@{name}"].outs == (f"runs/{name}",)


def test_the_tables_stage_reports_every_approach_xe_then_rl_then_the_others():
    s = stages()
    names = list(DECODERS)
    others = [n.split("@", 1)[1] for n in s if n.startswith("evaluate@")
              and not any(n == f"evaluate@{a}" or n == f"evaluate@{a}-rl" for a in names)]
    expected = ([f"evals/{n}" for n in names] + [f"evals/{n}-rl" for n in names]
                + [f"evals/{n}" for n in others])
    assert [n for n in s if n.startswith("adversarial@")] == ["adversarial@hacap"]
    assert sorted(s["tables"].deps) == sorted(expected)
    reported = [w for w in s["tables"].argv if w.startswith("evals/")]
    assert reported == list(s["tables"].deps)
    for run in others:  # every other evaluated run is trained by a stage of its own
        assert any(f"runs/{run}" in st.outs for st in s.values()), run
