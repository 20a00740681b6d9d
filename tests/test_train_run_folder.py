"""A training's run folder under stress: a second training into a busy folder, restarts that keep
the old runs, damaged checkpoints, logs and CIDEr-D caches, a full disk, SIGTERM and resume,
a folder without last.pt, a FIFO as the log."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import CapstackError
from process_helpers import CAPSTACK, capstack, last_line, run_capstack
from trainer.config import load_experiment
from trainer.train import train
from trainer_fixtures import write_experiment, write_feature_store


def test_a_second_training_into_a_busy_run_folder_is_refused_naming_the_holder(data, tmp_path):
    _, prepared, grid, _ = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=10_000)
    first = subprocess.Popen([CAPSTACK, "train", str(exp), "--out", "runs/x"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        lock = tmp_path / "runs" / "x.lock"
        deadline = time.time() + 120
        while not (lock.is_file() and lock.read_text() and (tmp_path / "runs/x/config.json")
                   .is_file()):
            assert first.poll() is None and time.time() < deadline, "the first training ended"
            time.sleep(0.2)
        second = capstack("train", exp, "--out", "runs/x", "--set", "train.lr=0.1", cwd=tmp_path)
        assert second.returncode != 0
        assert f"training into runs/x is already running: held by pid {first.pid}" in \
            second.stderr, second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert json.loads((tmp_path / "runs/x/config.json").read_text())["train"]["lr"] == 5e-3


def test_a_second_restart_keeps_the_first_old_run(data, tmp_path):
    _, prepared, grid, _ = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="gru_init", captions=prepared,
                           features=[grid], epochs=1)
    for hidden in (32, 16, 8):
        train(load_experiment(exp, [f"decoder.hidden={hidden}"]), tmp_path / "run",
              progress=False, restart_on_change=True)
    kept = {p.name: load_experiment_hidden(p) for p in tmp_path.glob("run*") if p.is_dir()}
    assert kept == {"run": 8, "run.old": 32, "run.old.2": 16}
    with pytest.raises(CapstackError, match="decoder.hidden"):
        train(load_experiment(exp, ["decoder.hidden=4"]), tmp_path / "run", progress=False)


def load_experiment_hidden(run: Path) -> int:
    return json.loads((run / "config.json").read_text())["decoder"]["hidden"]


def test_a_checkpoint_with_flipped_bytes_is_refused(data, tmp_path):
    import torch

    from trainer.checkpoint import load_checkpoint

    _, prepared, grid, _ = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    train(load_experiment(exp), tmp_path / "run", progress=False)
    path = tmp_path / "run" / "last.pt"
    weight = max(load_checkpoint(path)["model"].values(), key=lambda t: t.numel())
    raw = bytearray(path.read_bytes())
    at = raw.find(weight.reshape(-1)[:8].numpy().tobytes())
    assert at > 0
    raw[at + 5] ^= 0x10  # one bit of one weight
    path.write_bytes(bytes(raw))
    assert torch.load(path, weights_only=True)  # torch itself reads it without complaint
    for args in (["evaluate", path, "--out", tmp_path / "eval"],
                 ["train", exp, "--out", tmp_path / "run", "--set", "train.epochs=2"]):
        result = capstack(*args, cwd=tmp_path)
        assert result.returncode == 1 and f"{path}: damaged checkpoint" in result.stderr, \
            result.stderr


def test_a_training_on_a_full_disk_names_the_checkpoint_and_keeps_the_last_good_one(
        data, tmp_path, small_disk):
    from trainer.checkpoint import load_checkpoint

    _, prepared, grid, _ = data
    disk = small_disk("disk", "2m")
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    assert capstack("train", exp, "--out", disk / "run", cwd=tmp_path).returncode == 0
    with open(disk / "filler", "wb") as filler:  # the disk fills up between two trainings
        with pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    result = capstack("train", exp, "--out", disk / "run", "--set", "train.epochs=2",
                      cwd=tmp_path)
    assert result.returncode == 1
    assert f"{disk / 'run'}/" in result.stderr and ": cannot write it (No space left on " \
        "device); nothing written before was changed" in result.stderr, result.stderr
    assert load_checkpoint(disk / "run" / "last.pt")["epoch"] == 1  # whole, and the last good
    for line in (disk / "run" / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # no half-written line for a resume to choke on
    assert not list((disk / "run").glob(".*tmp*"))  # no half-written checkpoint left


def test_sigterm_stops_a_training_saying_so_and_the_same_command_resumes(data, tmp_path):
    _, prepared, grid, _ = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=10_000)
    run = subprocess.Popen([CAPSTACK, "train", str(exp), "--out", "run"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    deadline = time.time() + 120
    while not (tmp_path / "run" / "last.pt").is_file():  # an epoch done: something to keep
        assert run.poll() is None and time.time() < deadline, run.communicate()
        time.sleep(0.2)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 143 and "stopped by SIGTERM" in stderr, (run.returncode, stderr)
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["state"] == "stopped" and state["error"].startswith("stopped by SIGTERM")
    resumed = capstack("train", exp, "--out", "run", "--set", "train.epochs=1", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr  # the lock was released, the run intact


def test_a_resume_drops_a_damaged_log_line_saying_so(data, tmp_path):
    _, prepared, grid, _ = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1)
    assert run_capstack("train", exp, "--out", "run", cwd=tmp_path).returncode == 0
    log = tmp_path / "run" / "metrics.jsonl"
    before = log.read_text()
    with open(log, "a") as f:
        f.write('{"kind": "train", "step": 1, "lo\n[1, 2]\n')  # half a line, then not an entry
    resumed = run_capstack("train", exp, "--out", "run", "--set", "train.epochs=2",
                           cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr  # was: json.JSONDecodeError
    lines = len(before.splitlines())
    assert f"run/metrics.jsonl: lines {lines + 1}, {lines + 2} are no log entry; dropped (the " \
        f"log as it was is kept as run/metrics.jsonl.damaged)" in resumed.stderr, resumed.stderr
    assert (tmp_path / "run" / "metrics.jsonl.damaged").read_text().startswith(before)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert max(e["epoch"] for e in entries if e["kind"] == "val") == 1  # the second epoch's


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def cider_cache_damages(good: Path) -> dict[str, tuple[bytes, str]]:
    raw = good.read_bytes()
    with np.load(good) as loaded:
        arrays = {k: loaded[k] for k in loaded.files}
    header = json.loads(arrays["header"].tobytes())
    no_words = np.frombuffer(json.dumps({k: v for k, v in header.items() if k != "words"})
                             .encode(), np.uint8)
    return {
        "text": (b"not a cache\n", "not a CIDEr-D cache (not an .npz file)"),
        "a pickle": (pickle.dumps({"a": 1}), "not a CIDEr-D cache (not an .npz file)"),
        "truncated": (raw[:len(raw) // 2], "not a CIDEr-D cache (File is not a zip file)"),
        "objects": (npz(**{**arrays, "df": np.array([{}], dtype=object)}),
                    "not a CIDEr-D cache (it holds pickled Python objects, which capstack "
                    "never loads)"),
        "no words": (npz(**{**arrays, "header": no_words}),
                     "a damaged CIDEr-D cache (header.words: expected a list of words)"),
        "no df": (npz(**{k: v for k, v in arrays.items() if k != "df"}),
                  "a damaged CIDEr-D cache (expected the arrays df, "),
        "short df": (npz(**{**arrays, "df": arrays["df"][:-3]}),
                     "a damaged CIDEr-D cache (its arrays disagree in length)"),
    }


def test_a_damaged_cider_cache_is_named_and_never_suggests_allow_pickle(data, tmp_path):
    from trainer.rewards.cider import CiderD
    from trainer.rewards.cider_cache import build_cache

    root, prepared, grid, _ = data
    good = tmp_path / "good.npz"
    build_cache(prepared, "train", good)
    for name, (content, problem) in cider_cache_damages(good).items():
        path = tmp_path / f"{name}.npz"
        path.write_bytes(content)
        with pytest.raises(CapstackError) as refused:
            CiderD.load(path)
        message = str(refused.value)
        assert message.startswith(f"{path}: {problem}") and "allow_pickle" not in message \
            and message.endswith("; rebuild it: capstack cider-cache"), (name, message)
    assert zipfile.is_zipfile(good)
    damaged = tmp_path / "truncated.npz"
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1,
                           objective={"name": "scst", "reward": {"name": "cider-d",
                                                                 "cache": str(damaged)}})
    result = run_capstack("train", exp, "--out", "run", cwd=tmp_path)
    assert result.returncode == 1 and last_line(result).startswith(
        f"Error: {damaged}: not a CIDEr-D cache (File is not a zip file)")
    assert os.path.getsize(damaged) > 0


def test_a_run_folder_without_last_pt_refuses_another_recipe(data, tmp_path):
    folder = data.prepared
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
