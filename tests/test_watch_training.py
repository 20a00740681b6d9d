"""Training you can watch: the line per epoch, `capstack runs`, TensorBoard, the version.

Real tiny trainings in tmp dirs; the CLI through click's runner (in this process: a
subprocess would spend seconds importing torch).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from pipeline.core.errors import CapstackError
from pipeline.core.runlock import exclusive_beside
from trainer.config import load_experiment
from trainer.runs import evaluation_folder, list_runs
from trainer.train import train
from trainer.training import loop
from trainer_fixtures import write_experiment

ROOT = Path(__file__).resolve().parents[1]
EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+)  loss (\d+\.\d{3})  val CIDEr (\d+\.\d)  "
                        r"best (\d+\.\d) \((epoch \d+|start)\)  (\d+\.\d) s")


def experiment(data, path: Path, **train_settings) -> Path:
    _, prepared, grid, _ = data
    return write_experiment(path, decoder="show_tell", captions=prepared, features=[grid],
                            **train_settings)


def capstack(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


def log_entries(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def dies_at_call(monkeypatch, n: int, error: BaseException) -> None:
    real_step, calls = loop.train_step, []

    def step(parts, position, batch):
        calls.append(1)
        if len(calls) == n:
            raise error
        return real_step(parts, position, batch)

    monkeypatch.setattr(loop, "train_step", step)


# -- the line per epoch -------------------------------------------------------------------------

def test_train_prints_a_line_per_epoch_then_the_summary_as_before(data, tmp_path):
    exp = experiment(data, tmp_path / "st.yaml", epochs=2, log_every=1)
    result = capstack("train", exp, "--out", tmp_path / "runs" / "st")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    epochs = [EPOCH_LINE.fullmatch(line) for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and all(epochs), lines
    steps = log_entries(tmp_path / "runs" / "st", "train")  # log_every 1: every step's loss
    vals = log_entries(tmp_path / "runs" / "st", "val")
    for k, m in enumerate(epochs):
        assert m.group(1, 2) == (str(k + 1), "2")
        mean = sum(s["loss"] for s in steps if s["epoch"] == k) / 3  # 3 batches an epoch
        # CIDEr x100, the report's scale: the log keeps 0.512, the line says 51.2
        assert m.group(3) == f"{mean:.3f}" and m.group(4) == f"{100 * vals[k]['cider']:.1f}"
    best = max(range(2), key=lambda k: (vals[k]["cider"], -k))
    assert epochs[1].group(5, 6) == (f"{100 * vals[best]['cider']:.1f}", f"epoch {best + 1}")
    assert re.fullmatch(rf"train st: 2 epochs, 6 steps; best val CIDEr {epochs[1].group(5)} "
                        rf"\(greedy\) at epoch {best + 1} -> {re.escape(str(tmp_path))}/runs/st/"
                        r"best\.pt", lines[-1]), lines[-1]


def test_a_resumed_epoch_reports_the_mean_loss_of_all_its_steps(data, tmp_path, monkeypatch):
    exp = load_experiment(experiment(data, tmp_path / "st.yaml", epochs=2, checkpoint_every=2))
    whole = []
    train(exp, tmp_path / "whole", progress=False, on_epoch=whole.append)
    dies_at_call(monkeypatch, 3, RuntimeError("disk on fire"))  # after the step-2 checkpoint
    with pytest.raises(RuntimeError):
        train(exp, tmp_path / "runs" / "split", progress=False)
    state = json.loads((tmp_path / "runs" / "split" / "state.json").read_text())
    assert state["state"] == "failed" and state["error"] == "disk on fire"
    monkeypatch.undo()
    resumed = []
    train(exp, tmp_path / "runs" / "split", progress=False, on_epoch=resumed.append)
    assert [(r.epoch, r.loss, r.val_cider, r.best_epoch) for r in resumed] == \
        [(r.epoch, r.loss, r.val_cider, r.best_epoch) for r in whole]
    assert json.loads((tmp_path / "runs" / "split" / "state.json").read_text())["state"] == \
        "finished"


# -- capstack runs ------------------------------------------------------------------------------

@pytest.mark.parametrize("run, evals", [
    ("runs/top_down", "evals/top_down"),  # the stages' evaluate@top_down writes there too
    ("coco/runs/stack_cap/show_tell", "coco/evals/stack_cap/show_tell"),
    ("exps/mc3/runs/top_down", "exps/mc3/evals/top_down"),
    ("elsewhere/my-run", "elsewhere/evals/my-run"),
])
def test_evaluate_writes_where_the_stages_do(run, evals, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / run).mkdir(parents=True)
    (tmp_path / run / "best.pt").touch()
    assert evaluation_folder(Path(run)) == evaluation_folder(Path(run) / "best.pt") == Path(evals)


def test_runs_lists_every_state_the_best_and_the_test_score(data, tmp_path, monkeypatch):
    work = tmp_path / "work"
    runs = work / "runs"
    exp = experiment(data, tmp_path / "st.yaml", epochs=2)

    seen, snapshot = [], {}

    def look(report):  # during the training: running, one epoch of two done
        seen.append({r.name: r for r in list_runs(work)}["b-running"])
        snapshot.setdefault("state", (runs / "b-running" / "state.json").read_text())

    train(load_experiment(exp), runs / "a-finished", progress=False)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no java: no METEOR's 20 s
    monkeypatch.chdir(work)  # evaluate's default out: evals/NAME, as the stages write it
    evaluated = capstack("evaluate", "runs/a-finished", "--figures", 0)
    assert evaluated.exit_code == 0, evaluated.output
    assert "-> evals/a-finished/metrics.json" in evaluated.output
    assert not (runs / "a-finished" / "eval").exists()
    metrics = json.loads((work / "evals" / "a-finished" / "metrics.json").read_text())
    train(load_experiment(exp), runs / "b-running", progress=False, on_epoch=look)
    train(load_experiment(exp), runs / "c-killed", progress=False)
    (runs / "c-killed" / "state.json").write_text(snapshot["state"])  # what a SIGKILL leaves
    dies_at_call(monkeypatch, 4, CapstackError("features: image 7 unreadable"))
    with pytest.raises(CapstackError):
        train(load_experiment(exp), runs / "d-failed", progress=False)
    dies_at_call(monkeypatch, 4, cli.Terminated("stopped by SIGTERM"))
    stopped = capstack("train", exp, "--out", runs / "e-stopped")
    assert stopped.exit_code == 143 and "stopped by SIGTERM" in stopped.output
    (runs / "f-broken").mkdir()
    (runs / "f-broken" / "config.json").write_text("{")
    (runs / "g-notes").mkdir()  # not a run: left out
    (runs / "g-notes" / "todo.txt").write_text("try lr 1e-3")

    assert seen[0].state == "running" and (seen[0].epochs_done, seen[0].epochs) == (1, 2)
    assert seen[0].best_epoch == 1
    listed = json.loads(capstack("runs", work, "--json").stdout)
    rows = {r["name"]: r for r in listed}
    assert [r["name"] for r in listed] == ["a-finished", "b-running", "c-killed", "d-failed",
                                           "e-stopped", "f-broken"]
    finished = rows["a-finished"]
    summary = json.loads((runs / "a-finished" / "summary.json").read_text())
    assert (finished["decoder"], finished["objective"], finished["state"]) == \
        ("show_tell", "xe", "finished")
    assert (finished["epochs_done"], finished["epochs"]) == (2, 2)
    state = json.loads((runs / "a-finished" / "state.json").read_text())
    assert (finished["best_cider"], finished["best_epoch"]) == \
        (summary["best_cider"], summary["best_epoch"]) == \
        (state["best_cider"], state["best_epoch"])  # one count of epochs: the third is 3
    assert finished["test_cider"] == metrics["metrics"]["CIDEr"] and finished["notes"] == []
    assert rows["b-running"]["state"] == "finished"  # it has finished since
    assert rows["c-killed"]["state"] == "stopped" and rows["c-killed"]["epochs_done"] == 1
    assert "ended without recording how" in rows["c-killed"]["notes"][0]
    failed = rows["d-failed"]
    assert failed["state"] == "failed" and failed["error"] == "features: image 7 unreadable"
    assert failed["epochs_done"] == 1 and failed["test_cider"] is None
    assert rows["e-stopped"]["state"] == "stopped" and rows["e-stopped"]["epochs_done"] == 1
    assert rows["e-stopped"]["error"] == "stopped by SIGTERM"
    broken = rows["f-broken"]
    assert broken["state"] is None and broken["decoder"] is None
    assert broken["notes"][0].startswith(f"{runs / 'f-broken' / 'config.json'}: not valid JSON "
                                         f"(line 1 column 2")

    table = capstack("runs", work).stdout.splitlines()
    assert table[0].split() == ["name", "decoder", "objective", "epochs", "state", "best", "val",
                                "CIDEr", "test", "CIDEr"]
    assert re.fullmatch(rf"a-finished +show_tell +xe +2/2 +finished +"
                        rf"{100 * finished['best_cider']:.1f} \(epoch {finished['best_epoch']}\)"
                        rf" +{100 * finished['test_cider']:.1f}", table[1]), table[1]
    assert f"  {100 * metrics['metrics']['CIDEr']:.1f}" in evaluated.output  # as evaluate says
    assert re.fullmatch(r"d-failed +show_tell +xe +1/2 +failed +\d+\.\d \(epoch 1\) +-",
                        table[table.index(next(t for t in table if t.startswith("d-failed")))])
    assert "    failed: features: image 7 unreadable" in table
    assert "    stopped: stopped by SIGTERM" in table
    assert re.fullmatch(r"f-broken +\? +\? +\?/\? +\? +- +-", table[-2]), table
    assert table[-1].startswith("    ") and "config.json: not valid JSON" in table[-1]


def test_runs_says_what_is_damaged_held_or_stale(data, tmp_path):
    runs = tmp_path / "runs"
    exp = experiment(data, tmp_path / "st.yaml", epochs=1)
    train(load_experiment(exp), runs / "st", progress=False)
    evals = tmp_path / "evals" / "st"
    evals.mkdir(parents=True)
    (evals / "metrics.json").write_text('{"metrics": {"CIDEr": null}}')
    (runs / "st" / "state.json").write_text('["finished"]')
    (row,) = list_runs(tmp_path)
    assert row.state is None and row.test_cider is None
    assert row.notes == [f"{runs / 'st' / 'state.json'}: expected a JSON object, got list",
                         f"{evals / 'metrics.json'}: metrics.CIDEr: expected float, got None"]

    (runs / "st" / "state.json").unlink()  # a run trained before runs kept a record
    (evals / "metrics.json").write_text(json.dumps({"metrics": {"CIDEr": 0.25}, "split": "test"}))
    os.utime(evals / "metrics.json", (1, 1))  # evaluated before best.pt was last written
    with exclusive_beside(runs / "st", "training into runs/st"):
        (row,) = list_runs(tmp_path)
    assert row.state == "running" and row.epochs_done == 1 and row.test_cider == 0.25
    assert row.notes == [f"{evals / 'metrics.json'}: older than {runs / 'st' / 'best.pt'} "
                         f"(trained on since): evaluate again"]
    (row,) = list_runs(tmp_path)
    assert row.state == "finished"

    assert capstack("runs", tmp_path / "nothing-here").exit_code == 1
    (tmp_path / "empty").mkdir()
    assert capstack("runs", tmp_path / "empty").stdout == f"no runs under {tmp_path}/empty/runs\n"


def write_run(folder: Path, record: dict | None = None, **files: str) -> Path:
    """A run folder as a training leaves it: its config, ``state.json`` (``record``; None: a
    run of the older layout, which kept none) and ``files`` (summary_json: summary.json)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"decoder": {"name": "show_tell"},
                                                    "objective": {"name": "xe"},
                                                    "train": {"epochs": 2}}))
    if record is not None:
        (folder / "state.json").write_text(json.dumps(
            {"capstack": "capstack-run", "state": "finished", "epochs": 2, "epochs_done": 2,
             **record}))
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


def test_one_damaged_run_of_the_older_layout_is_its_own_row_and_nan_is_never_best(tmp_path):
    runs = tmp_path / "runs"
    for name, best_epoch in [("best-x", '"x"'), ("best-null", "null"), ("best-1e400", "1e400")]:
        write_run(runs / name, summary_json=f'{{"epochs": 2, "best_cider": 0.5, '
                                            f'"best_epoch": {best_epoch}}}')
    write_run(runs / "epoch-inf", metrics_jsonl='{"kind": "val", "epoch": Infinity, '
                                                '"cider": 0.2}\n')
    write_run(runs / "nan-val", metrics_jsonl="".join(
        f'{{"kind": "val", "epoch": {e}, "cider": {c}}}\n'
        for e, c in [(0, 0.2), (1, "NaN"), (2, 0.1)]))
    write_run(runs / "nan-state", {"best_cider": float("nan"), "best_epoch": 2})
    write_run(runs / "good", summary_json='{"epochs": 2, "best_cider": 0.5, "best_epoch": 1}')

    rows = {r.name: r for r in list_runs(tmp_path)}
    assert sorted(rows) == ["best-1e400", "best-null", "best-x", "epoch-inf", "good",
                            "nan-state", "nan-val"]
    good = rows["good"]
    assert (good.state, good.best_cider, good.best_epoch, good.notes) == ("finished", 0.5, 2, [])
    for name, shown in [("best-x", "'x'"), ("best-null", "None"), ("best-1e400", "inf")]:
        row = rows[name]
        assert (row.state, row.best_cider, row.best_epoch) == ("finished", 0.5, None)
        assert row.notes == [f"{runs / name / 'summary.json'}: best_epoch: expected an epoch "
                             f"number from -1, got {shown}"]
    assert rows["epoch-inf"].best_cider is None and rows["epoch-inf"].notes[0] == (
        f"{runs / 'epoch-inf' / 'metrics.jsonl'}: line 1: a validation of epoch inf scored 0.2 "
        f"(expected an epoch from -1 and a number)")
    nan_val = rows["nan-val"]  # the best is the best finite score, not the NaN after it
    assert (nan_val.best_cider, nan_val.best_epoch, nan_val.epochs_done) == (0.2, 1, 3)
    assert rows["nan-state"].best_cider is None and rows["nan-state"].notes == [
        f"{runs / 'nan-state' / 'state.json'}: best_cider: expected a finite number, got nan"]

    table = capstack("runs", tmp_path)
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert re.fullmatch(r"best-x +show_tell +xe +2/2 +finished +50\.0 \(epoch \?\) +-",
                        lines[lines.index(next(t for t in lines if t.startswith("best-x")))])
    assert re.fullmatch(r"nan-val +show_tell +xe +3/2 +stopped +20\.0 \(epoch 1\) +-",
                        next(t for t in lines if t.startswith("nan-val")))
    assert not re.search(r"(nan|inf) \((epoch|start)", table.stdout, re.I)  # no such best


def test_one_run_with_two_names_is_one_row(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "top_down", {"best_cider": 0.5, "best_epoch": 2})
    (runs / "latest").symlink_to("top_down")
    (tmp_path / "elsewhere").mkdir()
    outside = write_run(tmp_path / "elsewhere" / "st", {"best_cider": 0.4, "best_epoch": 1})
    for name in ("st-a", "st-b"):
        (runs / name).symlink_to(outside)
    with exclusive_beside(runs / "latest", "training into runs/latest"):
        rows = list_runs(tmp_path)
        table = capstack("runs", tmp_path).stdout.splitlines()
    assert [(r.name, r.state, r.links, r.link) for r in rows] == [
        ("st-a", "finished", ["st-b"], str(outside)),
        ("top_down", "running", ["latest"], None)]
    assert "    also named latest (a link to this run)" in table
    assert sum(line.startswith(("top_down", "latest")) for line in table) == 1
    assert any(line.startswith(f"st-a -> {outside} ") for line in table)


def test_an_experiment_lists_the_baselines_linked_runs_as_links(tmp_path):
    from pipeline.engine.experiments import mirror

    write_run(tmp_path / "runs" / "top_down", {"best_cider": 0.5, "best_epoch": 2})
    write_run(tmp_path / "runs" / "show_tell", {"best_cider": 0.4, "best_epoch": 1})
    exp = tmp_path / "exps" / "seed1"
    mirror(tmp_path, exp, ["runs/top_down"])  # the experiment trains its own top_down
    write_run(exp / "runs" / "top_down", {"best_cider": 0.6, "best_epoch": 2})
    rows = {r.name: r for r in list_runs(exp)}
    assert (rows["top_down"].link, rows["top_down"].best_cider) == (None, 0.6)
    assert rows["show_tell"].link == os.path.join("..", "..", "..", "runs", "show_tell")
    table = capstack("runs", exp).stdout
    assert "show_tell -> ../../../runs/show_tell" in table
    assert "not this folder's own run: a link to another's" in table
    assert [r.link for r in list_runs(tmp_path)] == [None, None]  # the baseline's own

    other = tmp_path / "exps" / "lr"
    mirror(tmp_path, other, ["evals/top_down"])  # no run of its own: runs/ is a link
    assert [(r.name, r.link) for r in list_runs(other)] == [
        ("show_tell", str(tmp_path / "runs" / "show_tell")),
        ("top_down", str(tmp_path / "runs" / "top_down"))]


# -- TensorBoard ---------------------------------------------------------------------------------

def test_tensorboard_events_hold_the_logged_scalars(data, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed "
                                              "(pip install 'capstack[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    exp = experiment(data, tmp_path / "st.yaml", epochs=2, log_every=1)
    assert capstack("train", exp, "--out", tmp_path / "off").exit_code == 0
    assert not (tmp_path / "off" / "events").exists()  # off unless asked for
    assert capstack("train", exp, "--out", tmp_path / "on", "--tensorboard").exit_code == 0
    assert list((tmp_path / "on" / "events").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "on" / "events"))
    events.Reload()
    assert {"train/loss", "train/lr", "val/cider"} <= set(events.Tags()["scalars"])
    vals = [v["cider"] for v in log_entries(tmp_path / "on", "val")]
    assert [e.step for e in events.Scalars("val/cider")] == [3, 6]  # 3 steps an epoch
    assert [e.value for e in events.Scalars("val/cider")] == pytest.approx(vals, rel=1e-6)
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert json.loads((tmp_path / "on" / "config.json").read_text())["train"]["tensorboard"]


def test_tensorboard_asked_for_but_not_installed_is_one_line_before_training(data, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard", None)
    exp = experiment(data, tmp_path / "st.yaml", epochs=1)
    result = capstack("train", exp, "--out", tmp_path / "run", "--set", "train.tensorboard=true")
    assert result.exit_code == 1
    assert result.stderr == "Error: train.tensorboard: asked for, but tensorboard is not " \
        "installed: pip install 'capstack[tensorboard]' (or leave it off: metrics.jsonl holds " \
        "the same numbers)\n"
    assert not (tmp_path / "run").exists()


# -- licence and version -------------------------------------------------------------------------

def test_version_from_the_metadata_or_the_source(monkeypatch):
    assert capstack("--version").stdout == "capstack 0.1.0\n"
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert capstack("--version").stdout == "capstack 0.1.0\n"


def test_the_licence_is_mit_and_declared():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads TOML")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert project["optional-dependencies"]["tensorboard"] == ["tensorboard>=2.14"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the capstack authors\n")
