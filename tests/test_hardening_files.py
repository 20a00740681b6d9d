"""What a careless user's files did to capstack, written as the repros, kept fixed: outputs that
replaced what they should not (a device node, another command's folder, another recipe's run)
and reads that never ended (a FIFO where a file was expected).

Every command runs as a child process of this source tree's ``cli.py`` with a timeout, so a
regression to a blocking read fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import pytest
import yaml

import cli
from pipeline.core.atomic import OUTPUT_MARKER
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from process_helpers import run_capstack
from trainer.config import load_experiment
from trainer.train import train
from trainer_fixtures import make_prepared, write_experiment, write_feature_store

TIMEOUT = 90  # s: the slowest command here starts torch on a busy machine


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    dataset, prepared = make_prepared(root)
    return root, dataset, prepared


def special_file(path: Path, kind: str) -> Path:
    """A FIFO, or a character device like /dev/null (made only where this process may)."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    return path


def still_special(path: Path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)


# -- 1. outputs replace only regular files ---------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_output_file_never_replaces_a_device_node_or_a_fifo(prepared, tmp_path, kind):
    root, dataset, folder = prepared
    node = special_file(tmp_path / "devnull", kind)
    asked = [("cider-cache", folder, "--out", node),
             ("extract-grid", dataset, dataset.parent, "--pointer", node),
             ("import-features", "folder", tmp_path, "--dataset", dataset, "--pointer", node),
             ("train-detector", dataset, dataset.parent, node),
             ("train-backbone", dataset, dataset.parent, node)]
    for args in asked:
        result = run_capstack(*args, cwd=tmp_path, timeout=TIMEOUT)
        assert result.returncode == 2, (args, result.stderr)
        assert "not a regular file" in result.stderr and "an output replaces only a regular " \
            "file" in result.stderr, (args, result.stderr)
        assert still_special(node, kind), args
    with pytest.raises(CapstackError, match="devnull: not a regular file"):
        write_json(node, {"written": True})  # every atomic output, whoever asks for it
    assert still_special(node, kind)
    forced = run_capstack("shapes", node, "--train", 1, "--val", 1, "--test", 1, "--size", 32,
                          "--force", cwd=tmp_path, timeout=TIMEOUT)
    assert forced.returncode != 0 and "not a regular file" in forced.stderr, forced.stderr
    assert still_special(node, kind)


def test_a_symbolic_link_output_is_replaced_as_a_link(tmp_path):
    target = tmp_path / "kept.json"
    target.write_text("mine")
    link = tmp_path / "out.json"
    link.symlink_to(target)
    write_json(link, {"new": 1})
    assert not link.is_symlink() and json.loads(link.read_text()) == {"new": 1}
    assert target.read_text() == "mine"


def test_a_command_never_replaces_a_folder_another_command_wrote(tmp_path):
    shapes = tmp_path / "s2"
    assert run_capstack("shapes", shapes, "--train", 2, "--val", 1, "--test", 1, "--size", 32,
                        cwd=tmp_path, timeout=TIMEOUT).returncode == 0
    dataset = tmp_path / "dataset.json"
    dataset.write_bytes((shapes / "dataset_shapes.json").read_bytes())
    images = sorted(p.name for p in (shapes / "images").iterdir())
    refused = run_capstack("prepare", dataset, shapes, "--min-count", 1, cwd=tmp_path,
                           timeout=TIMEOUT)
    assert refused.returncode != 0
    assert f"{shapes}: `capstack shapes` wrote it, not `capstack prepare`" in refused.stderr
    assert sorted(p.name for p in (shapes / "images").iterdir()) == images
    prepared = tmp_path / "prepared"
    assert run_capstack("prepare", dataset, prepared, "--min-count", 1, cwd=tmp_path,
                        timeout=TIMEOUT).returncode == 0
    again = run_capstack("shapes", prepared, "--train", 1, "--val", 1, "--test", 1, "--size",
                         32, cwd=tmp_path, timeout=TIMEOUT)
    assert again.returncode != 0
    assert "`capstack prepare` wrote it, not `capstack shapes`" in again.stderr
    assert (prepared / "vocab.json").is_file()
    # its own command replaces it; a marker of a capstack that named no command still passes
    assert run_capstack("prepare", dataset, prepared, "--min-count", 2, cwd=tmp_path,
                        timeout=TIMEOUT).returncode == 0
    (shapes / OUTPUT_MARKER).write_text("written by capstack: a rerun of the command that "
                                        "wrote it may replace it whole\n")
    assert run_capstack("shapes", shapes, "--train", 1, "--val", 1, "--test", 1, "--size", 32,
                        cwd=tmp_path, timeout=TIMEOUT).returncode == 0


def test_a_run_folder_without_last_pt_refuses_another_recipe(prepared, tmp_path):
    root, _, folder = prepared
    from pipeline.captions.prepared import load_captions

    grid = write_feature_store(tmp_path / "grid.lmdb", load_captions(folder).image_ids)
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=folder,
                           features=[grid], epochs=1)
    run = tmp_path / "run"
    train(load_experiment(exp), run, progress=False)
    (run / "last.pt").unlink()
    best, log = (run / "best.pt").read_bytes(), (run / "metrics.jsonl").read_text()
    with pytest.raises(CapstackError, match=r"best.pt: train.lr: the run was trained with "
                                            r"0.005, the config asks 0.1"):
        train(load_experiment(exp, ["train.lr=0.1"]), run, progress=False)
    assert (run / "best.pt").read_bytes() == best and (run / "metrics.jsonl").read_text() == log
    (run / "best.pt").unlink()  # a training killed before its first checkpoint: its config
    with pytest.raises(CapstackError, match=r"config.json: train.lr: the run was trained"):
        train(load_experiment(exp, ["train.lr=0.1"]), run, progress=False)
    assert (run / "metrics.jsonl").read_text() == log
    train(load_experiment(exp, ["train.lr=0.1"]), run, progress=False, restart_on_change=True)
    assert (tmp_path / "run.old" / "metrics.jsonl").read_text() == log
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 0.1


# -- 6. a FIFO where a file is read ----------------------------------------------------------

STAGES = {"stages": {"shapes": {"cmd": "capstack shapes data --train 1 --val 1 --test 1",
                                "outs": ["data"]}}}


def fifo_cases(tmp_path: Path, dataset: Path) -> dict[str, tuple]:
    """What each command is asked, once ``fifo`` (a FIFO) stands where it reads a file."""
    fifo = tmp_path / "fifo"
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump(STAGES))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}]))
    return {
        "stages file": ("stages", "-c", fifo),
        "stages lock": ("stages",),
        "experiment": ("train", fifo, "--out", tmp_path / "run"),
        "dataset json": ("prepare", fifo, tmp_path / "prepared"),
        "--refs": ("evaluate", results, "--refs", fifo),
        "experiment manifest": ("stages", "--name", "x"),
    }


@pytest.mark.parametrize("case", ["stages file", "stages lock", "experiment", "dataset json",
                                  "--refs", "experiment manifest"])
def test_a_fifo_where_a_file_is_read_is_refused_not_waited_on(prepared, tmp_path, case):
    _, dataset, _ = prepared
    args = fifo_cases(tmp_path, dataset)[case]
    where = {"stages lock": tmp_path / "stages.lock",
             "experiment manifest": tmp_path / "exps" / "x" / "experiment.yaml"}.get(
        case, tmp_path / "fifo")
    where.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(where)
    result = run_capstack(*args, cwd=tmp_path, timeout=TIMEOUT)
    assert result.returncode == 1, result.stderr
    assert f"{where.name}: not a regular file (a FIFO), never read" in result.stderr, \
        result.stderr


def test_runs_notes_a_fifo_state_json_and_sigterm_stops_it(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    os.mkfifo(run / "state.json")
    (run / "config.json").write_text(json.dumps({"decoder": {"name": "show_tell"}}))
    os.mkfifo(run / "metrics.jsonl")
    result = run_capstack("runs", tmp_path, cwd=tmp_path, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "state.json: not a regular file (a FIFO), never read" in result.stdout
    (run / "state.json").unlink()
    result = run_capstack("runs", tmp_path, cwd=tmp_path, timeout=TIMEOUT)
    assert "metrics.jsonl: not a regular file (a FIFO), never read" in result.stdout

    # SIGTERM while a record is read ends the listing; it is no note about the file
    import trainer.runs

    def stopped(*args, **kw):
        raise cli.Terminated("stopped by SIGTERM")

    monkeypatch.setattr(trainer.runs, "read_json", stopped)
    with pytest.raises(cli.Terminated):
        trainer.runs.list_runs(tmp_path)


def test_a_fifo_as_a_training_log_is_refused_not_waited_on(tmp_path):
    from trainer.training.log import append_line

    def waited(signum, frame):
        raise TimeoutError("append_line waited for a reader of the FIFO")

    os.mkfifo(tmp_path / "metrics.jsonl")
    before = signal.signal(signal.SIGALRM, waited)
    signal.alarm(10)  # an open that blocks fails the test, not hangs it
    try:
        with pytest.raises(CapstackError, match="not a regular file \\(a FIFO\\), never written"):
            append_line(tmp_path / "metrics.jsonl", "{}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)



@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_lock_file_that_is_a_fifo_or_a_device_is_refused_not_waited_on(tmp_path, kind):
    """A second training into a run folder whose lock is a FIFO waited for ever to read who held
    it (and one whose lock named /dev/zero read without end)."""
    from pipeline.core.runlock import exclusive_beside

    def waited(signum, frame):
        raise TimeoutError("the lock's holder was read for ever")

    special_file(tmp_path / "x.lock", kind)
    before = signal.signal(signal.SIGALRM, waited)
    signal.alarm(10)
    try:
        with pytest.raises(CapstackError, match=r"x.lock: not a regular file \(a "):
            with exclusive_beside(tmp_path / "x", "training into x"):
                with exclusive_beside(tmp_path / "x", "training into x"):
                    pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert still_special(tmp_path / "x.lock", kind)
