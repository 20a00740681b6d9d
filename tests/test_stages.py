"""The stage engine on a real project in a tmp dir: decisions, reasons, runs, locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.engine.codeversion import code_files

STAGES = """
params:
  data: data/shapes
stages:
  shapes:
    cmd: capstack shapes ${data} --train ${train} --val 2 --test 2 --seed ${seed} --size 32
    params: {train: 6, seed: 0}
    outs:
      - ${data}
  prepare:
    cmd: capstack prepare ${data}/dataset_shapes.json data/prepared --min-count ${min_count}
    params: {min_count: 2}
    deps:
      - ${data}/dataset_shapes.json
    outs: [data/prepared]
"""


@pytest.fixture
def project(capstack):
    (capstack.workdir / "stages.yaml").write_text(STAGES)
    return capstack


def states(capstack) -> dict[str, str]:
    return {name: s["state"] for name, s in capstack.statuses().items()}


def reasons(capstack, stage: str) -> list[str]:
    return capstack.statuses()[stage]["reasons"]


def lock_entry(capstack, stage: str):
    lock = capstack.workdir / "stages.lock"
    return yaml.safe_load(lock.read_text())["stages"].get(stage) if lock.exists() else None


def test_fresh_project_never_run_then_demo_runs_everything_once(project):
    assert states(project) == {"shapes": "never run", "prepare": "never run"}
    out = project.stage_cmd("demo").output
    assert "Running stage 'shapes'" in out and "Running stage 'prepare'" in out
    assert (project.workdir / "data/prepared/vocab.json").exists()
    assert states(project) == {"shapes": "up to date", "prepare": "up to date"}
    again = project.stage_cmd("demo").output
    assert "Stage 'shapes' is up to date, skipping." in again
    assert "0 stage(s) ran" in again


def test_stages_marks_what_the_demo_runs_and_counts_it_apart(project):
    (project.workdir / "stages.yaml").write_text("demo: [shapes]\n" + STAGES)
    project.stage_cmd("demo")
    lines = project.stage_cmd("stages").output.splitlines()
    assert lines == ["shapes   demo  up to date", "prepare        never run",
                     "demo (`capstack demo`: shapes and what it needs): 1 stage, 1 up to date; "
                     "the other 1: 1 never run"]
    listing = project.statuses()
    assert (listing["shapes"]["demo"], listing["prepare"]["demo"]) == (True, False)


def test_the_real_demo_stages_are_marked(capstack):
    root = Path(__file__).resolve().parents[1]
    lines = capstack("stages", "-c", root / "stages.yaml", "--workdir",
                     capstack.workdir).output.splitlines()
    marked = [line.split()[0] for line in lines if line.split()[1:2] == ["demo"]]
    assert marked[0] == "shapes" and marked[-1] == "report" and "rl@top_down" in marked
    assert "tables" not in marked and "train@hacap" not in marked
    assert lines[-1].startswith(f"demo (`capstack demo`: report and what it needs): "
                                f"{len(marked)} stages, {len(marked)} never run; the other ")


def test_param_change_makes_stage_stale_with_reason(project):
    project.stage_cmd("demo")
    stages = project.workdir / "stages.yaml"
    stages.write_text(STAGES.replace("{min_count: 2}", "{min_count: 3}"))
    assert states(project) == {"shapes": "up to date", "prepare": "stale"}
    assert reasons(project, "prepare") == ["param min_count 2 -> 3"]
    out = project.stage_cmd("run", "prepare").output
    assert "Running stage 'prepare' (stale: param min_count 2 -> 3)" in out
    assert lock_entry(project, "prepare")["params"] == {"data": "data/shapes", "min_count": 3}
    assert states(project)["prepare"] == "up to date"


def test_dep_content_change_is_detected(project):
    project.stage_cmd("demo")
    dataset = project.workdir / "data/shapes/dataset_shapes.json"
    dataset.write_text(dataset.read_text().replace('"raw": "', '"raw": "Look: ', 1))
    assert "dep data/shapes/dataset_shapes.json changed" in reasons(project, "prepare")
    # the upstream stage's out was modified too, so it is stale as well
    assert reasons(project, "shapes") == ["out data/shapes modified"]


def test_touching_a_dep_without_changing_content_keeps_stage_up_to_date(project):
    project.stage_cmd("demo")
    dataset = project.workdir / "data/shapes/dataset_shapes.json"
    os.utime(dataset, (time.time() + 10, time.time() + 10))
    assert states(project) == {"shapes": "up to date", "prepare": "up to date"}


def test_cmd_change_is_detected(project):
    project.stage_cmd("demo")
    (project.workdir / "stages.yaml").write_text(
        STAGES.replace("--min-count ${min_count}", "--min-count ${min_count} --max-len 8"))
    assert reasons(project, "prepare") == ["cmd changed"]


def test_code_files_follow_imports_and_nothing_else(tmp_path):
    pkg = tmp_path / "pipeline"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pipeline import b\nfrom .sub import c\nimport numpy\n")
    (pkg / "b.py").write_text("from pipeline.errors import X\n")
    (pkg / "errors.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..b import thing\n")
    (pkg / "unrelated.py").write_text("")
    files = {str(p.relative_to(tmp_path)) for p in code_files("pipeline.a", tmp_path)}
    assert files == {"pipeline/__init__.py", "pipeline/a.py", "pipeline/b.py",
                     "pipeline/errors.py", "pipeline/sub/__init__.py", "pipeline/sub/c.py"}


def test_real_prepare_code_version_covers_its_modules():
    names = {p.name for p in code_files("pipeline.captions.prepare")}
    assert {"prepare.py", "karpathy.py", "vocab.py", "errors.py"} <= names
    assert "stages.py" not in names


def test_force_reruns_an_up_to_date_stage(project):
    project.stage_cmd("demo")
    first = lock_entry(project, "prepare")["finished"]
    time.sleep(1.1)
    out = project.stage_cmd("run", "prepare", "--force").output
    assert "Running stage 'prepare' (forced)" in out
    assert lock_entry(project, "prepare")["finished"] != first


def test_run_refuses_when_upstream_is_stale_unless_with_deps(project):
    project.stage_cmd("demo")
    (project.workdir / "stages.yaml").write_text(STAGES.replace("seed: 0", "seed: 1"))
    result = project.stage_cmd("run", "prepare", expect_ok=False)
    assert result.exit_code != 0
    assert "needs stage 'shapes', which is stale: param seed 0 -> 1" in result.output
    assert "--with-deps" in result.output
    out = project.stage_cmd("run", "prepare", "--with-deps").output
    assert out.index("Running stage 'shapes'") < out.index("Running stage 'prepare'")
    assert states(project) == {"shapes": "up to date", "prepare": "up to date"}


def test_run_refuses_when_upstream_never_ran(project):
    result = project.stage_cmd("run", "prepare", expect_ok=False)
    assert "needs stage 'shapes', which is never run" in result.output
    assert not (project.workdir / "data").exists()


def test_the_hint_to_run_a_stage_names_the_stages_file_and_workdir(project, monkeypatch):
    workdir = project.workdir
    result = project.stage_cmd("run", "prepare", expect_ok=False)
    assert (f"run `capstack run shapes -c {workdir / 'stages.yaml'} --workdir {workdir}` "
            f"first, or add --with-deps") in result.output
    (workdir / "configs").mkdir()
    (workdir / "stages.yaml").rename(workdir / "configs" / "coco.yaml")
    monkeypatch.chdir(workdir)
    result = project("run", "prepare", "-c", "configs/coco.yaml", expect_ok=False)
    assert "run `capstack run shapes -c configs/coco.yaml` first" in result.output
    result = project("run", "prepare", "-c", "configs/coco.yaml", "--name", "mc3", "--set",
                     "min_count=3", expect_ok=False)
    assert "run `capstack run shapes -c configs/coco.yaml --name mc3` first" in result.output


WEIGHTS_STAGE = """
stages:
  shapes:
    cmd: capstack shapes data/shapes --train 2 --val 0 --test 0 --size 32
    outs: [data/shapes]
  extract_grid:
    cmd: capstack extract-grid data/shapes/dataset_shapes.json data/shapes --backbone resnet101 \
--weights ${weights} --image-size 32 --grid 1 --workers 0 --pointer grid.json
    params: {weights: weights/resnet101.pth}
    deps: [data/shapes/dataset_shapes.json, "${weights}"]
    outs: [grid.json]
"""


def test_a_missing_input_file_gets_the_commands_own_message(tmp_path):
    """Weights no stage makes: the command runs and names them and where they come from,
    not the engine's bare 'dep ... does not exist'."""
    (tmp_path / "stages.yaml").write_text(WEIGHTS_STAGE)
    cli = Path(__file__).resolve().parents[1] / "cli.py"
    run = [sys.executable, str(cli), "run", "extract_grid", "--with-deps"]
    result = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1
    assert ("weights/resnet101.pth: backbone weights not found. resnet101's ImageNet weights are "
            "torchvision's state_dicts (IMAGENET1K_V1 https://download.pytorch.org/models/"
            "resnet101-63fe2227.pth") in result.stderr
    assert ("stage 'extract_grid' failed: `capstack extract-grid" in result.stderr
            and "(its dep weights/resnet101.pth does not exist); nothing was recorded"
            in result.stderr)
    assert not (tmp_path / "grid.json").exists()


def test_set_runs_the_stage_as_an_experiment_beside_the_baseline(project):
    project.stage_cmd("demo")
    project.stage_cmd("run", "prepare", "--set", "min_count=1")
    assert lock_entry(project, "prepare")["params"]["min_count"] == 2
    assert states(project) == {"shapes": "up to date", "prepare": "up to date"}
    experiment = project.workdir / "exps" / "min_count-1" / "stages.lock"
    assert yaml.safe_load(experiment.read_text())["stages"]["prepare"]["params"]["min_count"] == 1


def test_outs_deleted_makes_stage_stale(project):
    project.stage_cmd("demo")
    import shutil
    shutil.rmtree(project.workdir / "data/prepared")
    assert reasons(project, "prepare") == ["out data/prepared missing"]


def test_failed_command_records_nothing(project):
    (project.workdir / "stages.yaml").write_text(
        STAGES.replace("${data}/dataset_shapes.json data/prepared", "missing.json data/prepared")
        .replace("deps:\n      - ${data}/dataset_shapes.json", "deps: []"))
    project.stage_cmd("run", "shapes")
    result = project.stage_cmd("run", "prepare", expect_ok=False)
    assert result.exit_code != 0 and "stage 'prepare' failed" in result.output
    assert lock_entry(project, "prepare") is None
    assert not (project.workdir / "data/prepared").exists()


# -- killed half way, two at once -----------------------------------------------------------
SLOW = (STAGES.replace("{train: 6, seed: 0}", "{train: 4000, seed: 0}")
        .replace("--size 32", "--size 96"))


def _start_run(workdir: Path, stage: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "run", stage, "--workdir", str(workdir)],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(predicate, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _lock_free(path: Path) -> bool:
    """Whether no process holds the flock on ``path`` (a running-lock)."""
    import fcntl

    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def _partial_outputs(workdir: Path) -> list[Path]:
    data = workdir / "data"
    return [p for p in data.iterdir() if ".tmp-" in p.name] if data.exists() else []


def test_stage_killed_half_way_leaves_nothing_complete_then_reruns(capstack):
    (capstack.workdir / "stages.yaml").write_text(SLOW)
    proc = _start_run(capstack.workdir, "shapes")
    _wait_for(lambda: any(any(p.iterdir()) for p in _partial_outputs(capstack.workdir)
                          if p.is_dir() and (p / "images").exists()))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the stage's keeper holds its running-lock until the command it started is gone
    _wait_for(lambda: _lock_free(capstack.workdir / ".capstack/running/stages.shapes.pid"))
    assert not (capstack.workdir / "data/shapes").exists()
    assert lock_entry(capstack, "shapes") is None
    assert states(capstack)["shapes"] == "never run"
    (capstack.workdir / "stages.yaml").write_text(STAGES)  # rerun small, to keep the test short
    capstack.stage_cmd("run", "shapes")
    assert states(capstack)["shapes"] == "up to date"


def test_second_run_of_a_running_stage_refuses_naming_the_holder(capstack):
    (capstack.workdir / "stages.yaml").write_text(SLOW)
    proc = _start_run(capstack.workdir, "shapes")
    holder = capstack.workdir / ".capstack/running/stages.shapes.pid"
    try:
        _wait_for(lambda: holder.exists() and holder.read_text().strip())
        started = time.time()
        result = capstack.stage_cmd("run", "shapes", expect_ok=False)
        assert time.time() - started < 5
        assert result.exit_code != 0
        assert "stage 'shapes'" in result.output and "is already running" in result.output
        assert f"pid {proc.pid}" in result.output
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # the lock dies with its holder
    (capstack.workdir / "stages.yaml").write_text(STAGES)
    capstack.stage_cmd("run", "shapes")


def test_a_foreach_key_may_be_a_path(capstack):
    """configs/coco.yaml's train@stack_cap/top_down: the key names folders in the commands."""
    (capstack.workdir / "stages.yaml").write_text("""
stages:
  shapes:
    foreach:
      small/a: {seed: 0}
      small/b: {seed: 1}
    do:
      cmd: capstack shapes data/${key} --train 3 --val 1 --test 1 --seed ${item.seed} --size 32
      outs:
        - data/${key}
""")
    out = capstack.stage_cmd("run", "shapes@small/b").output
    assert "Running stage 'shapes@small/b'" in out
    assert (capstack.workdir / "data/small/b/dataset_shapes.json").is_file()
    assert states(capstack) == {"shapes@small/a": "never run", "shapes@small/b": "up to date"}


# -- a stage that runs computes its outs afresh; only an interrupted run of it resumes ------------
# The command acts as a resuming training does: outs it finds complete (out/done) are left as
# they are; otherwise it adds a line to out/log (and fails when the file `fail` exists, before
# its outs are complete).
RESUMING = """
stages:
  make:
    cmd: >-
      mkdir -p out && if [ ! -f out/done ]; then echo ${n} $(date +%s%N) >> out/log;
      if [ -f fail ]; then exit 1; fi; touch out/done; fi
    shell: true
    params: {n: 1}
    deps: [input.txt]
    outs: [out]
"""


@pytest.fixture
def resuming(capstack):
    (capstack.workdir / "stages.yaml").write_text(RESUMING)
    (capstack.workdir / "input.txt").write_text("a\n")
    return capstack


def _log(workdir: Path, folder: str = "out") -> list[str]:
    return [line.split()[0] for line in (workdir / folder / "log").read_text().splitlines()]


def test_a_stale_stage_computes_its_outs_afresh_and_sets_the_old_ones_aside(resuming):
    work = resuming.workdir
    resuming.stage_cmd("run", "make")
    first = (work / "out/log").read_text()
    (work / "stages.yaml").write_text(RESUMING.replace("{n: 1}", "{n: 2}"))
    out = resuming.stage_cmd("run", "make").output
    assert "Running stage 'make' (stale: param n 1 -> 2)" in out
    assert "out set aside as out.old" in out
    assert _log(work) == ["2"]  # made by this run, not the old outs found complete
    assert (work / "out.old/log").read_text() == first  # never deleted
    assert states(resuming) == {"make": "up to date"}
    (work / "input.txt").write_text("b\n")  # a dep's content: the same
    resuming.stage_cmd("run", "make")
    assert _log(work) == ["2"] and (work / "out.old.2/log").is_file()


def test_a_forced_stage_computes_its_outs_afresh(resuming):
    work = resuming.workdir
    resuming.stage_cmd("run", "make")
    first = (work / "out/log").read_text()
    out = resuming.stage_cmd("run", "make", "--force").output
    assert "Running stage 'make' (forced)" in out and "out set aside as out.old" in out
    assert (work / "out/log").read_text() != first and (work / "out/done").is_file()
    assert (work / "out.old/log").read_text() == first


def test_an_interrupted_run_resumes_with_the_same_cmd_params_code_and_deps(resuming):
    work = resuming.workdir
    (work / "fail").touch()
    assert resuming.stage_cmd("run", "make", expect_ok=False).exit_code != 0
    (work / "fail").unlink()
    out = resuming.stage_cmd("run", "make").output
    assert "resuming its interrupted run" in out and "set aside" not in out
    assert _log(work) == ["1", "1"]  # the interrupted run's outs, completed
    assert not (work / "out.old").exists()
    assert states(resuming) == {"make": "up to date"}


def test_an_interrupted_run_of_other_params_or_deps_is_set_aside(resuming):
    work = resuming.workdir
    (work / "fail").touch()
    resuming.stage_cmd("run", "make", expect_ok=False)
    (work / "fail").unlink()
    (work / "input.txt").write_text("changed\n")
    out = resuming.stage_cmd("run", "make").output
    assert "out set aside as out.old" in out and "resuming" not in out
    assert _log(work) == ["1"] and _log(work, "out.old") == ["1"]
    (work / "fail").touch()
    (work / "stages.yaml").write_text(RESUMING.replace("{n: 1}", "{n: 3}"))
    resuming.stage_cmd("run", "make", expect_ok=False)
    (work / "fail").unlink()
    (work / "stages.yaml").write_text(RESUMING.replace("{n: 1}", "{n: 4}"))
    resuming.stage_cmd("run", "make")
    # the complete outs of n=1, then the half made ones of n=3: each kept
    assert _log(work) == ["4"] and _log(work, "out.old.2") == ["1"]
    assert _log(work, "out.old.3") == ["3"]


def test_an_out_remade_byte_for_byte_leaves_no_copy(project):
    project.stage_cmd("demo")
    out = project.stage_cmd("run", "prepare", "--force").output
    assert "data/prepared set aside as data/prepared.old" in out
    assert "data/prepared was made again byte for byte: its copy data/prepared.old removed" in out
    assert not (project.workdir / "data/prepared.old").exists()
    assert states(project)["prepare"] == "up to date"


def test_an_out_being_written_is_never_set_aside(resuming):
    from pipeline.core.runlock import exclusive_beside

    work = resuming.workdir
    resuming.stage_cmd("run", "make")
    before = (work / "out/log").read_text()
    with exclusive_beside(work / "out", "training into out"):
        result = resuming.stage_cmd("run", "make", "--force", expect_ok=False)
    assert result.exit_code != 0
    assert "stage 'make': its out out cannot be set aside: a write of out is already running: " \
        "held by pid" in result.output
    assert (work / "out/log").read_text() == before and not (work / "out.old").exists()
