"""Experiments as stages: a changed decoder setting reruns that training only, never extraction."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from trainer_fixtures import make_prepared, write_experiment

STAGES = """
stages:
  extract_grid:
    cmd: capstack extract-grid {data}/dataset_shapes.json {data} --backbone resnet18 \
--weights random --image-size 64 --grid 2 --workers 0 --features-root {root} \
--pointer features/grid.json
    deps: [{data}/dataset_shapes.json]
    outs: [features/grid.json]
  train-soft:
    cmd: capstack train soft.yaml --out runs/soft --restart-on-change --set train.seed=${{seed}}
    params: {{seed: 0}}
    deps: [soft.yaml, features/grid.json]
    outs: [runs/soft]
  train-gru:
    cmd: capstack train gru.yaml --out runs/gru --restart-on-change
    deps: [gru.yaml, features/grid.json]
    outs: [runs/gru]
"""


def capstack(workdir, *args):
    result = subprocess.run([sys.executable, "-m", "cli", *args, "--workdir", str(workdir)],
                            capture_output=True, text=True, cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.slow
def test_changing_a_decoder_setting_reruns_only_that_training(tmp_path):
    dataset, prepared = make_prepared(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "stages.yaml").write_text(STAGES.format(data=dataset.parent, root=tmp_path / "f"))
    for name, decoder in (("soft", "soft_attention"), ("gru", "gru_init")):
        write_experiment(work / f"{name}.yaml", decoder=decoder, captions=prepared,
                         features=[work / "features" / "grid.json"], epochs=1)
    first = capstack(work, "demo")
    assert "demo: 3 stage(s) ran" in first and "train soft:" in first
    config = yaml.safe_load((work / "soft.yaml").read_text())
    config["decoder"]["hidden"] = 24
    (work / "soft.yaml").write_text(yaml.safe_dump(config))
    lines = dict(line.split(None, 1) for line in capstack(work, "stages").strip().splitlines())
    assert lines == {"extract_grid": "up to date", "train-soft": "stale: dep soft.yaml changed",
                     "train-gru": "up to date"}
    again = capstack(work, "run", "train-soft")
    assert "Running stage 'train-soft'" in again and "extract-grid" not in again
    ckpt_hidden = json.loads((work / "runs" / "soft" / "config.json").read_text())
    assert ckpt_hidden["decoder"]["hidden"] == 24
    assert (work / "runs" / "soft.old" / "last.pt").is_file()  # the earlier run, moved aside
    final = capstack(work, "demo")
    assert "demo: 0 stage(s) ran, 3 up to date." in final
