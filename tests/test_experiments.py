"""Named experiments on a real project in a tmp dir: capstack's shapes and prepare stages, then
a training and an evaluation stage that are small python scripts (the engine runs any
program). An experiment's stages write in exps/NAME/, the baseline's files stay byte for byte,
the same settings are up to date, other settings under the same name are refused, and
seeds run as experiments of their own."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

# train.py PREPARED OUT SEED: a "model" from the vocabulary and the seed
TRAIN = """\
import json, pathlib, sys
prepared, out, seed = sys.argv[1:]
words = json.loads(pathlib.Path(prepared, "vocab.json").read_text())
pathlib.Path(out).mkdir(parents=True, exist_ok=True)
model = {"words": len(str(words)), "seed": int(seed)}
pathlib.Path(out, "model.json").write_text(json.dumps(model))
"""
# evaluate.py RUN OUT: metrics.json as capstack evaluate writes it (its "metrics")
EVALUATE = """\
import json, os, pathlib, sys
run, out = sys.argv[1:]
model = json.loads(pathlib.Path(run, "model.json").read_text())
pathlib.Path(out).mkdir(parents=True, exist_ok=True)
cider = model["words"] / 10000 + model["seed"] / 100
setting = {"experiment": os.environ["CAPSTACK_EXPERIMENT"]}
pathlib.Path(out, "metrics.json").write_text(json.dumps({"metrics": {"CIDEr": cider},
                                                         "setting": setting}))
"""

STAGES = """
params:
  data: data/shapes
  python: {python}
stages:
  shapes:
    cmd: capstack shapes ${{data}} --train 6 --val 2 --test 2 --seed ${{seed}} --size 32
    params: {{seed: 0}}
    outs:
      - ${{data}}
  prepare:
    cmd: capstack prepare ${{data}}/dataset_shapes.json data/prepared --min-count ${{min_count}}
    params: {{min_count: 2}}
    deps:
      - ${{data}}/dataset_shapes.json
    outs: [data/prepared]
  train:
    cmd: ${{python}} scripts/train.py data/prepared runs/model ${{seed}}
    params: {{seed: 0}}
    deps: [scripts/train.py, data/prepared]
    outs: [runs/model]
  evaluate:
    cmd: ${{python}} scripts/evaluate.py runs/model evals/model
    deps: [scripts/evaluate.py, runs/model]
    outs: [evals/model]
"""


@pytest.fixture
def project(capstack):
    scripts = capstack.workdir / "scripts"
    scripts.mkdir()
    (scripts / "train.py").write_text(TRAIN)
    (scripts / "evaluate.py").write_text(EVALUATE)
    (capstack.workdir / "stages.yaml").write_text(STAGES.format(python=json.dumps(sys.executable)))
    capstack.stage_cmd("run", "evaluate", "--with-deps")
    return capstack


def baseline_files(workdir: Path) -> dict[str, str]:
    """Every file of the baseline (the engine's own state aside), by path: its md5."""
    return {str(p.relative_to(workdir)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(workdir.rglob("*"))
            if p.is_file() and p.relative_to(workdir).parts[0] not in ("exps", ".capstack")}


def states(capstack, *args) -> dict[str, str]:
    listing = json.loads(capstack.stage_cmd("stages", "--json", *args).output)
    return {name: s["state"] for name, s in listing.items()}


def test_an_experiment_writes_its_own_outs_and_leaves_the_baseline_byte_for_byte(project):
    before = baseline_files(project.workdir)
    refused = project.stage_cmd("run", "evaluate", "--set", "min_count=1", "--name", "mc1",
                                expect_ok=False)  # a setting is a param of the stage run
    assert "stage 'evaluate'" in refused.output and "has no param 'min_count'" in refused.output
    assert not (project.workdir / "exps").exists()
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    out = project.stage_cmd("run", "evaluate", "--name", "mc1", "--with-deps").output
    assert "[mc1] Running stage 'train'" in out and "[mc1] Running stage 'evaluate'" in out
    assert "Running stage 'shapes'" not in out  # upstream of the setting: the baseline's
    assert baseline_files(project.workdir) == before
    folder = project.workdir / "exps" / "mc1"
    for own in ("data/prepared", "runs/model", "evals/model"):
        assert (folder / own).is_dir() and not (folder / own).is_symlink()
    assert (folder / "data" / "shapes").is_symlink()  # shared, read through a link
    vocab = (folder / "data/prepared/vocab.json").read_bytes()
    assert vocab != (project.workdir / "data/prepared/vocab.json").read_bytes()
    assert states(project, "--name", "mc1") == dict.fromkeys(
        ["shapes", "prepare", "train", "evaluate"], "up to date")
    assert states(project) == dict.fromkeys(["shapes", "prepare", "train", "evaluate"],
                                            "up to date")


def test_the_same_name_and_settings_again_is_up_to_date(project):
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    again = project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1").output
    assert "Stage 'prepare' is up to date, skipping." in again
    assert "Running" not in again


def test_other_settings_under_the_same_name_are_refused_with_what_differs(project):
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    before = baseline_files(project.workdir / "exps" / "mc1")
    result = project.stage_cmd("run", "prepare", "--set", "min_count=3", "--name", "mc1",
                               expect_ok=False)
    assert result.exit_code != 0
    assert "experiment 'mc1' was made with other settings (min_count: 1 -> 3)" in result.output
    assert baseline_files(project.workdir / "exps" / "mc1") == before


def test_set_without_a_name_makes_an_experiment_named_by_its_settings(project):
    before = baseline_files(project.workdir)
    out = project.stage_cmd("run", "prepare", "--set", "min_count=1").output
    assert "experiment min_count-1" in out
    assert (project.workdir / "exps/min_count-1/data/prepared/vocab.json").is_file()
    assert baseline_files(project.workdir) == before
    assert states(project)["prepare"] == "up to date"


def test_exp_diff_lists_exactly_the_changed_params(project):
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    project.stage_cmd("run", "evaluate", "--with-deps", "--name", "mc1")
    project.stage_cmd("run", "train", "--set", "seed=7", "--name", "s7")
    project.stage_cmd("run", "evaluate", "--name", "s7")
    lines = project.stage_cmd("exp", "diff", "mc1").output.splitlines()
    assert lines[0].split() == ["mc1", "baseline"]
    assert lines[1].split() == ["min_count", "1", "2"]
    assert all(not line.startswith("seed") for line in lines)
    both = project.stage_cmd("exp", "diff", "mc1", "s7").output.splitlines()
    assert [line.split()[:3] for line in both[1:3]] == [["min_count", "1", "2"],
                                                        ["seed", "0", "7"]]
    assert any(line.startswith("evaluate CIDEr") for line in both)


def test_exp_list_and_show_give_settings_states_and_metrics(project):
    project.stage_cmd("run", "train", "--set", "seed=7", "--name", "s7")
    listing = project.stage_cmd("exp", "list").output
    assert "s7" in listing and "seed: 0 -> 7" in listing
    assert "1 up to date, 1 never run" in listing  # train ran, its evaluate not yet
    project.stage_cmd("run", "evaluate", "--name", "s7")
    rows = json.loads(project.stage_cmd("exp", "show", "--json").output)
    assert [(r["experiment"], r["evaluation"], r["seed"], r["state"]) for r in rows] == [
        ("baseline", "evaluate", "0", "up to date"), ("s7", "evaluate", "7", "up to date")]
    assert float(rows[1]["CIDEr"]) == pytest.approx(float(rows[0]["CIDEr"]) + 7, abs=0.11)


def test_removing_an_experiment_removes_only_its_outputs(project):
    before = baseline_files(project.workdir)
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    project.stage_cmd("run", "evaluate", "--with-deps", "--name", "mc1")
    project.stage_cmd("run", "train", "--set", "seed=7", "--name", "s7")
    project.stage_cmd("exp", "remove", "mc1")
    assert not (project.workdir / "exps" / "mc1").exists()
    project.stage_cmd("run", "train", "--name", "s7", "--seeds", "8")
    refused = project.stage_cmd("exp", "remove", "s7", expect_ok=False)
    assert "experiment 's7': s7-seed8 share its stages (its seeds)" in refused.output
    project.stage_cmd("exp", "remove", "s7-seed8")
    assert (project.workdir / "exps" / "s7" / "runs/model/model.json").is_file()
    assert baseline_files(project.workdir) == before
    assert states(project) == dict.fromkeys(["shapes", "prepare", "train", "evaluate"],
                                            "up to date")


def test_seeds_run_once_each_as_their_own_experiments_and_are_skipped_when_done(project):
    out = project.stage_cmd("run", "evaluate", "--seeds", "1", expect_ok=False).output
    assert "no experiment seed1 for stage 'evaluate', which has no param 'seed'" in out
    out = project.stage_cmd("run", "train", "--seeds", "0-2").output
    assert "Stage 'train' is up to date, skipping." in out  # seed 0: the baseline's run
    assert "[seed1] Running stage 'train'" in out and "[seed2] Running stage 'train'" in out
    for seed in (1, 2):
        model = project.workdir / "exps" / f"seed{seed}" / "runs/model/model.json"
        assert json.loads(model.read_text())["seed"] == seed
    again = project.stage_cmd("run", "train", "--seeds", "0,1,2").output
    assert "Running" not in again
    names = [line.split()[0] for line in project.stage_cmd("exp", "list").output.splitlines()]
    assert names == ["experiment", "seed1", "seed2"]
    # a stage downstream, without a seed param, runs in each seed's experiment
    out = project.stage_cmd("run", "evaluate", "--seeds", "0-2").output
    assert "[seed1] Running stage 'evaluate'" in out and "[seed2] Running stage 'evaluate'" in out
    assert "Stage 'evaluate' is up to date, skipping." in out  # seed 0: the baseline's
    refused = project.stage_cmd("run", "evaluate", "--seeds", "0-3", expect_ok=False).output
    assert "no experiment seed3" in refused
    upstream = project.stage_cmd("run", "prepare", "--seeds", "0,1", expect_ok=False).output
    assert "experiment seed1 does not change stage 'prepare'" in upstream


def test_a_variant_run_at_its_own_seed_alone_is_evaluated_over_that_seed(project):
    """``--seeds 0 --name V`` on a stage without a seed param, before any other seed of V has
    run: seed 0 is V's own (its upstream stages' seed), not an experiment V-seed0."""
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    project.stage_cmd("run", "train", "--seeds", "0", "--name", "mc1")
    out = project.stage_cmd("run", "evaluate", "--seeds", "0", "--name", "mc1").output
    assert "[mc1] Running stage 'evaluate'" in out
    assert (project.workdir / "exps" / "mc1" / "evals" / "model" / "metrics.json").is_file()
    refused = project.stage_cmd("run", "evaluate", "--seeds", "1", "--name", "mc1",
                                expect_ok=False).output
    assert "no experiment mc1-seed1" in refused


def test_each_seeds_run_folder_has_its_own_lock_so_seeds_train_at_once(project):
    """capstack train leaves ``runs/NAME.lock`` beside its run folder. An experiment that
    reruns the stage writes its own ``runs/NAME``, so the lock beside it is its own too: one
    linked to the baseline's made every seed's training refuse the others ("already
    running"), which ran them one at a time at best."""
    from pipeline.core.runlock import exclusive_beside

    (project.workdir / "runs" / "model.lock").write_text("")  # as a training leaves it
    project.stage_cmd("run", "train", "--seeds", "1,2")
    seeds = [project.workdir / "exps" / f"seed{s}" / "runs" for s in (1, 2)]
    for runs in seeds:
        assert not (runs / "model.lock").is_symlink()
    with exclusive_beside(seeds[0] / "model", "seed 1's training"), \
            exclusive_beside(seeds[1] / "model", "seed 2's training"), \
            exclusive_beside(project.workdir / "runs" / "model", "seed 0's training"):
        pass  # three run folders, three locks: none refused


def test_a_stage_is_told_its_experiment_and_a_seed_its_group(project):
    def recorded(folder: str) -> str:
        doc = json.loads((project.workdir / folder / "evals/model/metrics.json").read_text())
        return doc["setting"]["experiment"]

    project.stage_cmd("run", "train", "--seeds", "0,1")
    project.stage_cmd("run", "evaluate", "--name", "seed1")
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    project.stage_cmd("run", "train", "--seeds", "0,1", "--name", "mc1")
    project.stage_cmd("run", "evaluate", "--name", "mc1-seed1")
    assert recorded(".") == "" and recorded("exps/seed1") == ""  # the baseline over seeds
    assert recorded("exps/mc1-seed1") == "mc1"
    # mc1's seed 1 keeps mc1's setting upstream, and shares mc1's prepare, run once
    assert states(project, "--name", "mc1-seed1") == dict.fromkeys(
        ["shapes", "prepare", "train", "evaluate"], "up to date")
    prepared = project.workdir / "exps/mc1-seed1/data/prepared"
    assert prepared.resolve() == (project.workdir / "exps/mc1/data/prepared").resolve()
    listing = json.loads(project.stage_cmd("stages", "--json", "--name", "mc1-seed1").output)
    assert [name for name, s in listing.items() if s["own"]] == ["train", "evaluate"]
