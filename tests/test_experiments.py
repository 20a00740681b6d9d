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
# evaluate.py RUN OUT EXPERIMENT: metrics.json as capstack evaluate writes it (its "metrics",
# the experiment in its "setting")
EVALUATE = """\
import json, pathlib, sys
run, out, experiment = sys.argv[1:]
model = json.loads(pathlib.Path(run, "model.json").read_text())
pathlib.Path(out).mkdir(parents=True, exist_ok=True)
cider = model["words"] / 10000 + model["seed"] / 100
setting = {"experiment": experiment}
pathlib.Path(out, "metrics.json").write_text(json.dumps({"metrics": {"CIDEr": cider},
                                                         "setting": setting}))
"""

STAGES = """
seed_param: seed
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
    cmd: ${{python}} scripts/evaluate.py runs/model evals/model ${{experiment}}
    deps: [scripts/evaluate.py, runs/model]
    outs: [evals/model]
    metrics:
      - {{path: evals/model/metrics.json, show: [metrics.CIDEr], percent: true}}
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


# -- names, folders and locks: what `exp` commands reach -------------------------------------

def test_a_name_that_is_a_path_is_refused_by_every_command_that_reads_one(capstack, tmp_path):
    """A manifest planted outside exps/ (a project handed over) once let `exp remove
    ../../victim` delete a folder outside the workdir, and `stages --name` link into it."""
    project = type(capstack)(tmp_path / "w")
    project.workdir.mkdir()
    (project.workdir / "stages.yaml").write_text(STAGES.format(python=json.dumps(sys.executable)))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "experiment.yaml").write_text(
        "name: ../../victim\ngroup: ../../victim\nparams: {min_count: 1}\nroots: [prepare]\n")
    (victim / "thesis.tex").write_text("years of work")
    for args in (("exp", "remove"), ("exp", "show"), ("exp", "diff"), ("stages", "--name")):
        refused = project.stage_cmd(*args, "../../victim", expect_ok=False)
        assert refused.exit_code != 0
        assert "'../../victim': an experiment's name is letters, digits" in refused.output
    assert sorted(p.name for p in victim.iterdir()) == ["experiment.yaml", "thesis.tex"]
    # a line break at the end of a name is no name either (`$` matched before it)
    refused = project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "abc\n",
                                expect_ok=False)
    assert "--name 'abc\\n': an experiment's name is" in refused.output
    assert not (project.workdir / "exps").exists()
    planted = project.workdir / "exps" / "abc\n"  # made by an older capstack, or by hand
    planted.mkdir(parents=True)
    (planted / "experiment.yaml").write_text(
        'name: "abc\\n"\nparams: {min_count: 1}\nroots: [prepare]\n')
    listing = project.stage_cmd("exp", "list").output
    assert listing.startswith("no experiments in") and listing.count("\n") == 1


def test_an_experiment_folder_that_is_a_link_is_never_written_through(project, tmp_path,
                                                                       caplog):
    """`exp remove` of one raised OSError; `exp list` and `stages --name` made links in its
    target."""
    project.stage_cmd("run", "prepare", "--set", "min_count=1", "--name", "mc1")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    (elsewhere / "experiment.yaml").write_text(
        "name: far\ngroup: far\nparams: {min_count: 3}\nroots: [prepare]\n")
    (project.workdir / "exps" / "far").symlink_to(elsewhere)
    listing = project.stage_cmd("exp", "list").output
    assert "mc1" in listing and "far" not in listing
    assert "exps/far: a symbolic link" in caplog.text
    refused = project.stage_cmd("stages", "--name", "far", expect_ok=False).output
    assert "exps/far: a symbolic link (to " in refused and "exp remove far" in refused
    assert sorted(p.name for p in elsewhere.iterdir()) == ["data", "experiment.yaml"]
    assert project.stage_cmd("exp", "remove", "far").exit_code == 0
    assert not (project.workdir / "exps" / "far").is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["data", "experiment.yaml"]


def test_an_experiment_is_not_removed_while_a_run_holds_one_of_its_locks(project):
    import os

    from pipeline.core.runlock import exclusive_beside, exclusive_run

    project.stage_cmd("run", "train", "--set", "seed=7", "--name", "s7")
    folder = project.workdir / "exps" / "s7"
    stage_lock = folder / ".capstack" / "running" / "stages.train.pid"
    assert stage_lock.is_file()  # the stage's run lock, as `capstack run` left it
    with exclusive_run(stage_lock, "stage 'train'"):
        refused = project.stage_cmd("exp", "remove", "s7", expect_ok=False).output
    assert f"experiment 's7' is in use: {stage_lock} is held by pid {os.getpid()}" in refused
    assert (folder / "runs/model/model.json").is_file()
    with exclusive_beside(folder / "runs" / "model", "training into runs/model"):
        refused = project.stage_cmd("exp", "remove", "s7", expect_ok=False).output
    assert f"{folder / 'runs' / 'model.lock'} is held by pid {os.getpid()}" in refused
    assert (folder / "runs/model/model.json").is_file()
    project.stage_cmd("exp", "remove", "s7")
    assert not folder.exists()


def test_exp_list_says_a_running_stage_and_exp_diff_a_stale_evaluation(project):
    from pipeline.core.runlock import exclusive_run

    project.stage_cmd("run", "train", "--set", "seed=7", "--name", "s7")
    lock = project.workdir / "exps/s7/.capstack/running/stages.evaluate.pid"
    with exclusive_run(lock, "stage 'evaluate'"):  # as while `capstack run evaluate` runs
        listing = project.stage_cmd("exp", "list").output
    assert "1 up to date, 1 running" in listing
    assert "1 up to date, 1 never run" in project.stage_cmd("exp", "list").output
    project.stage_cmd("run", "evaluate", "--name", "s7")
    fresh = project.stage_cmd("exp", "diff", "s7").output.splitlines()
    row = next(line for line in fresh if line.startswith("evaluate CIDEr"))
    assert "stale" not in row
    model = project.workdir / "exps/s7/runs/model/model.json"  # s7's training edited by hand
    model.write_text(model.read_text().replace('"seed": 7', '"seed": 70'))
    stale = project.stage_cmd("exp", "diff", "s7").output.splitlines()
    row = next(line for line in stale if line.startswith("evaluate CIDEr"))
    assert row.split()[2:] == [fresh[-1].split()[2], "(stale)", fresh[-1].split()[3]]


# -- seeds ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seeds, message", [
    ("0-100", "names more than 100 seeds, the most one command runs"),
    ("0-99,100", "names more than 100 seeds"),
    ("0-100000000", "names more than 100 seeds"),  # refused at once: counted, not expanded
    ("²", "expected seeds as 0,1,2 or 0-4 (ASCII digits), got '²'"),
    ("٣", "got '٣'"),  # an Arabic-Indic three once ran as seed 3
    ("5-2", "5-2 is no range; write it upwards (2-5)"),
    ("4294967296", "a seed is from 0 to 4294967295"),
])
def test_seeds_over_the_bound_or_not_ascii_are_refused_before_any_folder(project, seeds,
                                                                          message):
    refused = project.stage_cmd("run", "train", "--seeds", seeds, expect_ok=False)
    assert refused.exit_code != 0 and message in refused.output
    assert not (project.workdir / "exps").exists()


def test_a_seeds_folder_is_made_when_its_stage_runs_and_unmade_when_it_is_refused(project):
    """`100-2100` made 2,001 experiment folders before the first stage ran; a seed its
    command refused left its folder, and a name that then meant other settings."""
    from pipeline.engine.experiments import parse_seeds

    assert parse_seeds("0-99") == list(range(100)) and parse_seeds("3,1-3,0") == [3, 1, 2, 0]
    train = project.workdir / "scripts" / "train.py"
    train.write_text("import sys\nif sys.argv[3] == '2':\n    sys.exit('seed 2: refused')\n"
                     + TRAIN)
    refused = project.stage_cmd("run", "train", "--seeds", "1,2,3", expect_ok=False).output
    assert "[seed1] Running stage 'train'" in refused
    assert "experiment 'seed2': stage 'train' failed" in refused
    assert "its folder" in refused and "is removed again: it held no result" in refused
    exps = project.workdir / "exps"
    assert sorted(p.name for p in exps.iterdir()) == ["seed1"]  # seed 3 never reached
    assert (exps / "seed1/runs/model/model.json").is_file()


def test_a_refused_set_names_its_experiment_and_leaves_no_folder(project):
    train = project.workdir / "scripts" / "train.py"
    train.write_text("import sys\nif sys.argv[3] == '9':\n    sys.exit('seed 9: refused')\n"
                     + TRAIN)
    refused = project.stage_cmd("run", "train", "--set", "seed=9", "--name", "v",
                                expect_ok=False).output
    assert "experiment 'v': stage 'train' failed" in refused
    assert not (project.workdir / "exps" / "v").exists()
    project.stage_cmd("run", "train", "--set", "seed=8", "--name", "v")  # v is free again
    assert json.loads((project.workdir / "exps/v/runs/model/model.json").read_text())["seed"] == 8


# -- manifests -----------------------------------------------------------------------------

def test_a_damaged_manifest_is_set_aside_and_the_others_still_listed(project, caplog):
    project.stage_cmd("run", "train", "--set", "seed=7", "--name", "s7")
    project.stage_cmd("run", "train", "--set", "seed=8", "--name", "s8")
    manifest = project.workdir / "exps" / "s8" / "experiment.yaml"
    damaged = b"name: s8\nparams: {seed: [8\n"
    manifest.write_bytes(damaged)
    listing = project.stage_cmd("exp", "list").output
    assert "s7" in listing and "s8" not in listing
    assert f"{manifest}: damaged experiment manifest (not valid YAML" in caplog.text
    assert (manifest.parent / "experiment.yaml.damaged").read_bytes() == damaged  # nothing lost
    named = project.stage_cmd("stages", "--name", "s8", expect_ok=False).output
    assert "experiment 's8': its manifest was damaged, and set aside as" in named
    assert "seed" in project.stage_cmd("exp", "diff", "s7").output
    project.stage_cmd("exp", "remove", "s8")
    assert not manifest.parent.exists() and (project.workdir / "exps" / "s7").is_dir()


# -- paths in params -----------------------------------------------------------------------

COPY = """\
import pathlib, sys
source, out, tag = sys.argv[1:]
pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
pathlib.Path(out).write_text(pathlib.Path(source).read_text() + tag)
"""
PATHS = """
params:
  python: {python}
stages:
  copy:
    cmd: ${{python}} scripts/copy.py ${{src}} out/copy.txt ${{tag}}
    params: {{src: ../inputs/a.txt, tag: "-"}}
    deps:
      - ${{src}}
    outs: [out/copy.txt]
"""


def test_a_path_out_of_the_workdir_names_the_same_file_in_an_experiment(capstack, tmp_path):
    """An experiment runs in exps/NAME/, from where `../inputs/b.txt` was exps/inputs/b.txt."""
    project = type(capstack)(tmp_path / "w")
    (project.workdir / "scripts").mkdir(parents=True)
    (project.workdir / "scripts" / "copy.py").write_text(COPY)
    (project.workdir / "stages.yaml").write_text(PATHS.format(python=json.dumps(sys.executable)))
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "a.txt").write_text("A")
    (tmp_path / "inputs" / "b.txt").write_text("B")
    project.stage_cmd("run", "copy")
    project.stage_cmd("run", "copy", "--set", "src=../inputs/b.txt", "--name", "b")
    project.stage_cmd("run", "copy", "--set", "tag=+", "--name", "plus")  # the file's ../
    exps = project.workdir / "exps"
    assert (project.workdir / "out/copy.txt").read_text() == "A-"
    assert (exps / "b/out/copy.txt").read_text() == "B-"
    assert (exps / "plus/out/copy.txt").read_text() == "A+"
    assert states(project, "--name", "b") == {"copy": "up to date"}
    (tmp_path / "inputs" / "b.txt").write_text("B2")
    assert states(project, "--name", "b") == {"copy": "stale"}


# -- what a stage is told, and what exp show reads -------------------------------------------

NOTE = """\
import json, pathlib, sys
out, experiment, n = sys.argv[1:]
pathlib.Path(out).mkdir(parents=True, exist_ok=True)
pathlib.Path(out, "metrics.json").write_text(json.dumps(
    {"experiment": experiment, "count": int(n), "score": int(n) / 4, "ok": True}))
"""
NOTES = """
params:
  python: {python}
stages:
  a:
    cmd: ${{python}} scripts/note.py out/a ${{experiment}} ${{n}}
    params: {{n: 1}}
    deps: [scripts/note.py]
    outs: [out/a]
    metrics: [out/a/metrics.json]
  b:
    cmd: ${{python}} scripts/note.py out/b ${{experiment}} 2
    deps: [scripts/note.py]
    outs: [out/b]
"""


def test_a_stage_its_experiment_does_not_change_stays_shared_and_exp_show_reads_metrics(
        capstack, tmp_path):
    """``${experiment}`` is no param: stage b, which experiment x does not change, stays the
    baseline's (not rerun, told ""); a's metrics file, declared, is what exp show reads: its
    top-level numbers where the entry names none."""
    project = type(capstack)(tmp_path / "w")
    (project.workdir / "scripts").mkdir(parents=True)
    (project.workdir / "scripts" / "note.py").write_text(NOTE)
    (project.workdir / "stages.yaml").write_text(NOTES.format(python=json.dumps(sys.executable)))

    def told(folder: str) -> str:
        return json.loads((project.workdir / folder / "metrics.json").read_text())["experiment"]

    out = project.stage_cmd("run", "a").output
    assert "scripts/note.py out/a '' 1" in out  # the baseline's: an empty word
    project.stage_cmd("run", "b")
    assert "[x] Running stage 'a'" in project.stage_cmd("run", "a", "--set", "n=3",
                                                        "--name", "x").output
    shared = project.stage_cmd("run", "b", "--name", "x").output
    assert "Stage 'b' is up to date, skipping." in shared and "Running" not in shared
    assert told("out/a") == "" and told("out/b") == "" and told("exps/x/out/a") == "x"
    assert (project.workdir / "exps/x/out/b").is_symlink()
    rows = json.loads(project.stage_cmd("exp", "show", "--json").output)
    assert rows == [
        {"experiment": "baseline", "evaluation": "a", "n": "1", "state": "up to date",
         "count": "1", "score": "0.25"},
        {"experiment": "x", "evaluation": "a", "n": "3", "state": "up to date",
         "count": "3", "score": "0.75"}]
    diff = project.stage_cmd("exp", "diff", "x").output.splitlines()
    assert [line.split() for line in diff[1:]] == [["n", "3", "1"], ["a", "count", "3", "1"],
                                                   ["a", "score", "0.75", "0.25"]]
    # seeds: the param the stages file names, and this one names none
    refused = project.stage_cmd("run", "a", "--seeds", "0,1", expect_ok=False).output
    assert f"--seeds: {project.workdir / 'stages.yaml'} names no seed param; add a top-level " \
           f"`seed_param: NAME`" in refused
    assert sorted(p.name for p in (project.workdir / "exps").iterdir()) == ["x"]
