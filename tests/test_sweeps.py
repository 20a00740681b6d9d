"""Sweeps: experiments side by side (--jobs), a grid of --set values, submitit's jobs (--launcher
local, and --launcher slurm with sbatch and sacct stood in for), a stopped sweep resumed.

The projects are real folders in tmp dirs whose stages are small python scripts (the engine runs
any program), so each sweep's processes start in a fraction of a second; the slow test at the end
trains real decoders on shapes features."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.entry import capstack_command
from pipeline.engine.stagefile import load_stages_file, parse_values
from process_helpers import wait_for
from test_experiments import TRAIN, project, states  # noqa: F401  (project: a fixture)

# train.py DATA OUT SEED LR WIDTH CONFIG EXPERIMENT: a "run" whose metrics say its settings; it
# waits the seconds pause.json gives its seed, and notes the threads and GPU its process was given
STEP = """\
import json, os, pathlib, sys, time
data, out, seed, lr, width, config, experiment = sys.argv[1:]
started = time.time()
pause = pathlib.Path("pause.json")
if pause.exists():
    time.sleep(json.loads(pause.read_text()).get(seed, 0))
pathlib.Path(out).mkdir(parents=True, exist_ok=True)
cider = float(lr) * int(width) + int(seed) / 100 + len(pathlib.Path(data).read_text()) / 1000
env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
pathlib.Path(out, "metrics.json").write_text(json.dumps({
    "metrics": {"CIDEr": cider}, "env": env, "started": started, "ended": time.time(),
    "setting": {"experiment": experiment, "seed": int(seed)}}))
"""
DATA = """\
import pathlib, sys
out, size = sys.argv[1:]
pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
pathlib.Path(out).write_text("x" * int(size))
"""
STAGES = """
seed_param: seed
params:
  python: {python}
stages:
  data:
    cmd: ${{python}} scripts/data.py data/base.txt ${{size}}
    params: {{size: 3}}
    deps: [scripts/data.py]
    outs: [data/base.txt]
  train:
    cmd: >-
      ${{python}} scripts/train.py data/base.txt runs/model ${{seed}} ${{lr}} ${{width}}
      ${{config}} ${{experiment}}
    params: {{seed: 0, lr: 0.001, width: 8, config: a.yaml}}
    deps: [scripts/train.py, data/base.txt]
    outs: [runs/model]
    metrics:
      - {{path: runs/model/metrics.json, show: [metrics.CIDEr], percent: true}}
"""


@pytest.fixture
def sweep(capstack):
    """A project of two stages, `data` (shared) and `train` (seed, lr, width, config), none
    run yet."""
    scripts = capstack.workdir / "scripts"
    scripts.mkdir()
    (scripts / "train.py").write_text(STEP)
    (scripts / "data.py").write_text(DATA)
    (capstack.workdir / "stages.yaml").write_text(STAGES.format(python=json.dumps(sys.executable)))
    return capstack


def metrics(folder: Path) -> dict:
    return json.loads((folder / "runs/model/metrics.json").read_text())


# -- the grid's syntax -------------------------------------------------------------------------

def test_a_comma_lists_values_where_no_value_could_hold_one(sweep):
    file = load_stages_file(sweep.workdir / "stages.yaml", ["shapes"])
    stage = file.stage("train")
    assert parse_values("lr=1e-4,5e-4", stage, file.path) == ("lr", [1e-4, 5e-4])
    assert parse_values("lr=[1e-4, 5.0e-4, 1e-4]", stage, file.path) == ("lr", [1e-4, 5e-4])
    assert parse_values("width=8", stage, file.path) == ("width", [8])
    assert parse_values("config=[a.yaml, 'b,c.yaml']", stage, file.path) == (
        "config", ["a.yaml", "b,c.yaml"])
    # a string's value as typed: one value, whatever it holds but a comma
    assert parse_values("config=[x.yaml]", stage, file.path) == ("config", ["[x.yaml]"])
    assert parse_values('config="b,c.yaml"', stage, file.path) == ("config", ["b,c.yaml"])


@pytest.mark.parametrize("setting, message", [
    ("config=a.yaml,b.yaml", "'config' is a string param, and a string may hold a comma: for a "
                             "grid of values write them as a YAML list (--set 'config=[a.yaml, "
                             "b.yaml]'); for the one value 'a.yaml,b.yaml', quote it"),
    ("width=8,x", 'expected int, got "x"'),
    ("width=[]", "names no value"),
    ("lr=[[1]]", "expected a list of values"),
    ("width=" + ",".join(map(str, range(101))), "names 101 values, more than the 100"),
])
def test_an_ambiguous_or_bad_list_is_refused_before_any_folder(sweep, setting, message):
    refused = sweep.stage_cmd("run", "train", "--set", setting, "--with-deps", expect_ok=False)
    assert refused.exit_code != 0 and message in refused.output
    assert not (sweep.workdir / "exps").exists()


def test_a_grid_too_large_and_names_that_collide_are_refused(sweep):
    big = sweep.stage_cmd("run", "train", "--set", "width=" + ",".join(map(str, range(40))),
                          "--set", "lr=" + ",".join(f"{k + 1}e-3" for k in range(30)),
                          expect_ok=False).output
    assert "a grid of 1200 settings is more than the 1000 runs one command plans" in big
    clash = sweep.stage_cmd("run", "train", "--set", "config=[a/b.yaml, a-b.yaml]",
                            expect_ok=False).output
    assert "two points of the grid would both be experiment 'config-a-b.yaml'" in clash
    assert not (sweep.workdir / "exps").exists()


# -- side by side on this machine --------------------------------------------------------------

def test_jobs_run_side_by_side_each_with_its_share_of_the_cores_and_its_gpu(sweep):
    sweep.stage_cmd("run", "data")
    (sweep.workdir / "pause.json").write_text(json.dumps({"0": 1.5, "1": 1.5}))
    out = sweep.stage_cmd("run", "train", "--seeds", "0-2", "--jobs", "2", "--devices",
                          "0,1").output
    assert "== 3 runs of 'train', 2 at a time" in out
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // 2)
    assert f"{threads} CPU thread" in out
    assert "sweep: 3 done, 0 failed, 0 skipped (up to date)" in out
    runs = {"baseline": sweep.workdir, **{f"seed{s}": sweep.workdir / "exps" / f"seed{s}"
                                          for s in (1, 2)}}
    got = {name: metrics(folder) for name, folder in runs.items()}
    assert {m["setting"]["seed"] for m in got.values()} == {0, 1, 2}
    for m in got.values():
        assert m["env"]["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", str(threads))
    # two at a time, a GPU each: the baseline's run and seed 1's overlapped
    first, second = got["baseline"], got["seed1"]
    assert first["started"] < second["ended"] and second["started"] < first["ended"]
    assert {first["env"]["CUDA_VISIBLE_DEVICES"], second["env"]["CUDA_VISIBLE_DEVICES"]} == \
        {"0", "1"}
    assert got["seed2"]["env"]["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    for name, folder in runs.items():
        log = folder / ".capstack" / "logs" / "train.log"
        assert f"[{name}] started" in out and str(log) in out
        assert "Running stage 'train'" in log.read_text()
    again = sweep.stage_cmd("run", "train", "--seeds", "0-2", "--jobs", "2").output
    assert "sweep: 0 done, 0 failed, 3 skipped (up to date)" in again


def test_a_failed_experiment_is_said_with_its_log_and_the_others_go_on(project):  # noqa: F811
    train = project.workdir / "scripts" / "train.py"
    train.write_text("import sys\nif sys.argv[3] == '2':\n    sys.exit('seed 2: refused')\n"
                     + TRAIN)
    result = project.stage_cmd("run", "train", "--seeds", "1-3", "--jobs", "2", expect_ok=False)
    assert result.exit_code != 0
    log = project.workdir / "exps" / "seed2" / ".capstack" / "logs" / "train.log"
    assert "sweep: 2 done, 1 failed, 0 skipped (up to date)" in result.output
    assert "1 of 3 runs failed: seed2: exited with status 1: experiment 'seed2': stage " \
           "'train' failed" in result.output and f"(log: {log})" in result.output
    assert "seed 2: refused" in log.read_text()
    for seed in (1, 3):
        assert (project.workdir / "exps" / f"seed{seed}" / "runs/model/model.json").is_file()
    names = [line.split()[0] for line in project.stage_cmd("exp", "list").output.splitlines()]
    assert names == ["experiment", "seed1", "seed2", "seed3"]


def test_shared_stages_run_once_first_and_without_with_deps_are_asked_for(sweep):
    refused = sweep.stage_cmd("run", "train", "--seeds", "0-1", "--jobs", "2", expect_ok=False)
    assert "stage 'train' needs stage 'data', which is never run" in refused.output
    assert "or add --with-deps" in refused.output and not (sweep.workdir / "exps").exists()
    out = sweep.stage_cmd("run", "train", "--seeds", "0-1", "--jobs", "2", "--with-deps").output
    assert out.count("Running stage 'data'") == 1
    assert out.index("Running stage 'data'") < out.index("started")
    assert "sweep: 2 done" in out


@pytest.mark.parametrize("args, message", [
    (["--jobs", "2", "--launcher", "serial"],
     "--jobs: not an option of --launcher serial (launchers that take it: jobs, local)"),
    (["--jobs", "2", "--slurm-partition", "gpu"],
     "--slurm-partition: not an option of --launcher jobs (launchers that take it: slurm)"),
    (["--launcher", "slurm", "--devices", "0,1"], "--devices: not an option of --launcher slurm"),
    (["--jobs", "2", "--devices", "0,0"], "--devices '0,0': a GPU named twice"),
    (["--launcher", "slurm", "--time", "1h"], "--time '1h': expected minutes (90)"),
    (["--launcher", "slurm", "--slurm", "8"], "--slurm '8': expected NAME=VALUE"),
])
def test_options_a_launcher_does_not_take_are_refused(sweep, args, message):
    refused = sweep.stage_cmd("run", "train", "--seeds", "0-1", *args, expect_ok=False)
    assert refused.exit_code != 0 and message in refused.output
    assert not (sweep.workdir / "exps").exists()


def test_without_submitit_its_launchers_say_how_to_install_it(sweep, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    refused = sweep.stage_cmd("run", "train", "--launcher", "local", expect_ok=False).output
    assert "submitit, which is not installed: pip install capstack[slurm]" in refused


# -- stopped, and resumed ----------------------------------------------------------------------

def test_a_stopped_sweep_stops_every_run_and_the_same_command_resumes_it(sweep):
    """SIGINT (Ctrl-C) to `capstack run --jobs 2`: seed 1 done, seeds 2 and 3 running, 4 not
    started. Each running one is stopped and waited for, what a rerun does is said; the rerun
    skips the baseline and seed 1, resumes 2 and 3 (their stages' interrupted runs) and starts 4."""
    sweep.stage_cmd("run", "train", "--with-deps")
    (sweep.workdir / "pause.json").write_text(json.dumps({"2": 60, "3": 60}))
    argv = ["run", "train", "--seeds", "0-4", "--jobs", "2", "--workdir", sweep.workdir]
    parent = subprocess.Popen(capstack_command([str(a) for a in argv]), cwd=sweep.workdir,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    logs = {s: sweep.workdir / "exps" / f"seed{s}" / ".capstack/logs/train.log" for s in (2, 3)}
    try:
        wait_for(lambda: all(p.is_file() and "Running stage 'train'" in p.read_text()
                             for p in logs.values()), timeout=60)
        time.sleep(0.3)
        parent.send_signal(signal.SIGINT)
        out, _ = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode != 0
    assert "stopping 2 running" in out
    assert "sweep: 1 done, 0 failed, 1 skipped (up to date), 2 stopped, 1 not started" in out
    assert ("the same command again skips the 2 done; resumes the 2 stopped (seed2, seed3) "
            "where they stopped") in out and "starts the 1 not started" in out
    for log in logs.values():
        assert "stopped by SIGTERM" in log.read_text()
    (sweep.workdir / "pause.json").write_text("{}")
    again = sweep.stage_cmd("run", "train", "--seeds", "0-4", "--jobs", "2").output
    assert "[baseline] up to date, skipped" in again and "[seed1] up to date, skipped" in again
    assert "sweep: 3 done, 0 failed, 2 skipped (up to date)" in again
    for seed, log in logs.items():
        assert "resuming its interrupted run" in log.read_text().split("== ")[-1]
        assert metrics(sweep.workdir / "exps" / f"seed{seed}")["setting"]["seed"] == seed
    assert metrics(sweep.workdir / "exps" / "seed4")["setting"]["seed"] == 4


# -- submitit: the local executor, and what a cluster gets -------------------------------------

def test_local_jobs_run_a_two_by_two_grid_over_two_seeds_and_exp_show_lists_them(sweep):
    pytest.importorskip("submitit")
    out = sweep.stage_cmd("run", "train", "--set", "lr=2e-3,1e-2", "--set", "width=16,32",
                          "--seeds", "0-1", "--with-deps", "--launcher", "local", "--jobs",
                          "2").output
    assert "as submitit's local jobs, 2 at a time" in out
    assert "[shared stages] data: submitted as job" in out
    assert "sweep: 8 done, 0 failed, 0 skipped (up to date)" in out
    groups = ["lr-0.002+width-16", "lr-0.002+width-32", "lr-0.01+width-16", "lr-0.01+width-32"]
    names = [n for g in groups for n in (g, f"{g}-seed1")]
    exps = sweep.workdir / "exps"
    assert sorted(p.name for p in exps.iterdir()) == sorted(names)
    for name in names:
        m = metrics(exps / name)
        lr, width = (0.002 if "lr-0.002" in name else 0.01), (32 if "width-32" in name else 16)
        assert m["metrics"]["CIDEr"] == pytest.approx(lr * width + m["setting"]["seed"] / 100
                                                      + 0.003)
        assert m["setting"]["experiment"] == name.removesuffix("-seed1")
    rows = json.loads(sweep.stage_cmd("exp", "show", "--json").output)
    shown = {r["experiment"]: (r["lr"], r["width"], r["seed"], r["state"]) for r in rows}
    assert set(shown) == {"baseline", *names}
    assert shown["lr-0.01+width-32-seed1"] == ("0.01", "32", "1", "up to date")
    assert shown["lr-0.002+width-16"] == ("0.002", "16", "0", "up to date")
    listing = sweep.stage_cmd("exp", "list").output
    table, shared = listing.splitlines()[:-1], listing.splitlines()[-1]
    assert sum(" local " in line and line.endswith(" COMPLETED") for line in table) == 8
    assert shared.startswith("the baseline's jobs: local ")  # the shared stages' job
    assert shared.endswith(" COMPLETED")
    again = sweep.stage_cmd("run", "train", "--set", "lr=2e-3,1e-2", "--set", "width=16,32",
                            "--seeds", "0-1", "--launcher", "local").output
    assert "sweep: 0 done, 0 failed, 8 skipped (up to date)" in again


FAKE_SBATCH = """\
#!/bin/sh
here=$(dirname "$0")
n=$(cat "$here/counter" 2>/dev/null || echo 4240)
n=$((n + 1))
echo $n > "$here/counter"
cp "$1" "$here/job-$n.sbatch"
echo "Submitted batch job $n"
"""
FAKE_SACCT = """\
#!/bin/sh
echo "JobID|State|NodeList"
for id in $(ls "$(dirname "$0")" | sed -n 's/^job-\\([0-9]*\\).sbatch$/\\1/p'); do
  echo "$id|PENDING|None assigned"
done
"""


def test_slurm_jobs_carry_their_parameters_and_depend_on_the_shared_stages(sweep, tmp_path,
                                                                           monkeypatch):
    """sbatch, srun and sacct stood in for: what submitit hands sbatch (its script) and the job
    it pickles are what a cluster gets. The pickled job, run here, runs the experiment's stage
    where a local run writes it."""
    pytest.importorskip("submitit")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("sacct", FAKE_SACCT),
                       ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    out = sweep.stage_cmd("run", "train", "--set", "width=16,32", "--seeds", "0-1", "--with-deps",
                          "--launcher", "slurm", "--slurm-partition", "gpu", "--gpus-per-job",
                          "1", "--time", "1:30:00", "--slurm", "cpus_per_task=4", "--slurm",
                          "mem=16G").output
    assert "[shared stages] data: submitted as job 4241" in out
    assert "sweep: 4 submitted, 0 done, 0 failed, 0 skipped (up to date)" in out
    scripts = {n: (bin_ / f"job-{n}.sbatch").read_text() for n in range(4241, 4246)}
    assert "--dependency" not in scripts[4241] and "#SBATCH --job-name=capstack-shared" in \
        scripts[4241]
    for n in range(4242, 4246):
        for line in ("--dependency=afterok:4241", "--partition=gpu", "--gpus-per-node=1",
                     "--time=90", "--cpus-per-task=4", "--mem=16G", "--nodes=1",
                     "--ntasks-per-node=1"):
            assert f"#SBATCH {line}\n" in scripts[n], (n, line)
    assert "#SBATCH --job-name=capstack-width-32-seed1" in scripts[4245]
    # the job a node unpickles: `capstack run train --name ... --with-deps` in the workdir
    folder = sweep.workdir / ".capstack" / "submitit" / "4245"
    with open(folder / "4245_submitted.pkl", "rb") as f:
        job = pickle.load(f).function
    assert job.commands == (("run", "train", "-c", str(sweep.workdir / "stages.yaml"),
                             "--workdir", str(sweep.workdir), "--name", "width-32-seed1",
                             "--with-deps"),)
    assert dict(job.env) == {"OMP_NUM_THREADS": "4"}
    assert callable(job.checkpoint)  # submitit requeues it at its time limit
    listing = sweep.stage_cmd("exp", "list").output
    assert "slurm 4245 PENDING" in listing
    assert sum(line.endswith(" PENDING") for line in listing.splitlines()[1:-1]) == 4
    assert listing.splitlines()[-1] == "the baseline's jobs: slurm 4241 PENDING"
    queued = sweep.stage_cmd("run", "train", "--set", "width=16,32", "--seeds", "0-1",
                             "--with-deps", "--launcher", "slurm").output
    assert "[width-32-seed1] already submitted as job 4245 (PENDING), skipped" in queued
    assert "0 submitted, 4 queued before" in queued
    # run here, the stages it needs first: the pickled shared job, then the run's
    with open(sweep.workdir / ".capstack/submitit/4241/4241_submitted.pkl", "rb") as f:
        pickle.load(f).function()
    assert job() == str(sweep.workdir / "exps/width-32-seed1/.capstack/logs/train.log")
    assert metrics(sweep.workdir / "exps" / "width-32-seed1")["setting"] == {
        "experiment": "width-32", "seed": 1}
    assert states(sweep, "--name", "width-32-seed1") == {"data": "up to date",
                                                         "train": "up to date"}


# -- the demo's decoders, trained side by side -------------------------------------------------

TRAINING = """
seed_param: seed
stages:
  train:
    cmd: capstack train {experiment} --out runs/m --restart-on-change --set train.seed=${{seed}}
    params: {{seed: 0}}
    deps: [{experiment}]
    outs: [runs/m]
  evaluate:
    cmd: capstack evaluate runs/m --out evals/m --beam 2
    deps: [runs/m]
    outs: [evals/m]
"""


@pytest.mark.slow
def test_seeds_trained_two_at_a_time_report_as_one_row_and_a_killed_sweep_resumes(tmp_path,
                                                                                 no_java):
    """Real trainings on shapes features, as the demo's: three seeds two at a time, evaluated
    the same way, are one row of mean ± std in the report; a sweep stopped while two trainings
    run resumes them from their last checkpoints, the finished ones skipped."""
    from pipeline.captions.prepared import load_captions
    from process_helpers import run_capstack
    from trainer_fixtures import make_prepared, write_experiment, write_feature_store

    _, prepared = make_prepared(tmp_path, n_train=12, n_val=4, n_test=4)
    store = write_feature_store(tmp_path / "grid.lmdb", load_captions(prepared).image_ids)
    work = tmp_path / "work"
    work.mkdir()
    experiment = write_experiment(tmp_path / "top_down.yaml", decoder="top_down",
                                  captions=prepared, features=[store], epochs=2)
    (work / "stages.yaml").write_text(TRAINING.format(experiment=experiment))

    def capstack(*args, **kw):
        done = run_capstack(*args, cwd=work, timeout=900, **kw)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    out = capstack("run", "train", "--seeds", "0-2", "--jobs", "2")
    assert "sweep: 3 done, 0 failed, 0 skipped (up to date)" in out
    out = capstack("run", "evaluate", "--seeds", "0-2", "--jobs", "2")
    assert "sweep: 3 done" in out
    report = capstack("report", "evals/m", "exps/seed1/evals/m", "exps/seed2/evals/m",
                      "--out", "reports")
    rows = [line for line in report.splitlines() if line.startswith("| top_down")]
    assert len(rows) == 1 and " ± " in rows[0], report

    # a longer training, stopped while two seeds train, then resumed
    longer = write_experiment(tmp_path / "top_down.yaml", decoder="top_down",
                              captions=prepared, features=[store], epochs=40)
    assert longer.is_file()
    capstack("run", "train", "--force")  # seed 0: done before the sweep
    argv = capstack_command(["run", "train", "--seeds", "0,3,4", "--jobs", "2",
                             "--workdir", str(work)])
    parent = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    checkpoints = [work / "exps" / f"seed{s}" / "runs/m/last.pt" for s in (3, 4)]
    try:
        wait_for(lambda: all(p.is_file() for p in checkpoints), timeout=600)
        parent.send_signal(signal.SIGTERM)
        out, _ = parent.communicate(timeout=300)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert "2 stopped" in out and "resumes the 2 stopped (seed3, seed4)" in out, out
    again = capstack("run", "train", "--seeds", "0,3,4", "--jobs", "2")
    assert "[baseline] up to date, skipped" in again and "sweep: 2 done" in again
    for seed in (3, 4):
        log = (work / "exps" / f"seed{seed}" / ".capstack/logs/train.log").read_text()
        last = log.split("\n== ")[-1]
        assert "resuming its interrupted run" in last and "resumed at epoch" in last, log
