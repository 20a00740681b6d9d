"""Outputs and inputs that are no regular files: an output never replaces a device node, a FIFO
or a folder another command wrote, a symbolic link is replaced as a link, a FIFO where a file
is read is refused (never waited on), an id beyond 64 bits or 100k-deep JSON is named.

Every command runs as a child process of this source tree's ``cli.py`` with a timeout, so a
regression to a blocking read fails instead of hanging the suite.
"""

from __future__ import annotations

import cli
import json
import os
import signal
import stat
from pathlib import Path

import pytest
import yaml

from pipeline.core.atomic import OUTPUT_MARKER
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.demo.shapes import write_shapes_dataset
from process_helpers import capstack, run_capstack


TIMEOUT = 90  # s: the slowest command here starts torch on a busy machine


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


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_output_file_never_replaces_a_device_node_or_a_fifo(data, tmp_path, kind):
    dataset, folder = data.dataset, data.prepared
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
def test_a_fifo_where_a_file_is_read_is_refused_not_waited_on(data, tmp_path, case):
    dataset = data.dataset
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
    import trainer.run_fields
    import trainer.runs

    def stopped(*args, **kw):
        raise cli.Terminated("stopped by SIGTERM")

    monkeypatch.setattr(trainer.run_fields, "read_json", stopped)
    with pytest.raises(cli.Terminated):
        trainer.runs.list_runs(tmp_path)


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


def test_an_id_beyond_64_bits_and_100k_deep_json_or_yaml_are_named(tmp_path):
    write_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, n_test=1, seed=0, size=32)
    dataset = json.loads((tmp_path / "shapes" / "dataset_shapes.json").read_text())
    dataset["images"][1]["imgid"] = 2 ** 70
    (tmp_path / "big.json").write_text(json.dumps(dataset))
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.json").write_text(deep)
    (tmp_path / "deep.yaml").write_text(deep)
    (tmp_path / "stages.yaml").write_text(deep)
    for args, message in [
            (["prepare", "big.json", "out"], f"big.json: images[1].imgid: {2 ** 70} is outside "
                                             f"0..2**63-1"),
            (["extract-grid", "big.json", "shapes", "--backbone", "resnet18", "--weights",
              "random"], "big.json: images[1].imgid: "),
            (["prepare", "deep.json", "out"], "deep.json: nested deeper than the "),
            (["train", "deep.yaml", "--out", "run"], "deep.yaml: nested deeper than the "),
            (["stages"], "stages.yaml: nested deeper than the ")]:
        result = capstack(*args, cwd=tmp_path)
        assert result.returncode == 1 and message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()
