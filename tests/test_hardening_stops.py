"""Stopped and killed commands: their children end with them, their state says so, and one
folder reached by two names is written by one training at a time.

Real processes, each ended by a timeout should it hang.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.core.entry import capstack_command
from process_helpers import run_capstack, wait_for
from trainer_fixtures import make_prepared, write_experiment, write_feature_store

# Appends its pid to the file it is given, 20 times a second for two minutes: a command that
# outlives whatever should have ended it.
TICK = """\
import os, sys, time
open("tick.pid", "w").write(str(os.getpid()))
for _ in range(2400):
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stops")
    _, prepared = make_prepared(root)
    grid = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    return prepared, grid


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a slow init to reap it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def lock_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def start(*args, cwd: Path) -> subprocess.Popen:
    """``capstack ARGS`` in a session of its own (a signal sent to it reaches it alone)."""
    return subprocess.Popen(capstack_command([str(a) for a in args]), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def write_tick_stage(workdir: Path) -> None:
    (workdir / "tick.py").write_text(TICK)
    # `; echo` keeps the shell waiting: the tick is its child, the engine's grandchild
    (workdir / "stages.yaml").write_text(yaml.safe_dump({"stages": {"tick": {
        "cmd": f"{sys.executable} tick.py out.txt; echo done", "shell": True,
        "outs": ["out.txt"]}}}))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_shells_child_ends_with_the_engine_killed_or_stopped(tmp_path, sig):
    write_tick_stage(tmp_path)
    engine = start("run", "tick", cwd=tmp_path)
    tick = 0
    try:
        tick = int(wait_for(lambda: (tmp_path / "tick.pid").is_file()
                            and (tmp_path / "tick.pid").read_text(), timeout=60))
        os.kill(engine.pid, sig)  # the engine alone, as a scheduler or the OOM killer would
        engine.communicate(timeout=60)
        wait_for(lambda: not alive(tick), timeout=20)
        lines = (tmp_path / "out.txt").read_text().count("\n")
        time.sleep(0.5)
        assert (tmp_path / "out.txt").read_text().count("\n") == lines  # nobody writes on
        if sig == signal.SIGTERM:
            assert engine.returncode == 143, engine.stderr
        assert lock_free(tmp_path / ".capstack" / "running" / "stages.tick.pid")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)
        if tick and alive(tick):
            os.kill(tick, signal.SIGKILL)


def test_a_rerun_is_refused_while_a_killed_engines_command_is_still_stopping(tmp_path):
    (tmp_path / "slow.py").write_text(
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: open('asked', 'w').close())\n"
        "open('started', 'w').close()\n"
        "time.sleep(4)\n"
        "open('out.txt', 'w').write('done')\n")
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"slow": {
        "cmd": f"{sys.executable} slow.py", "outs": ["out.txt"]}}}))
    engine = start("run", "slow", cwd=tmp_path)
    try:
        wait_for(lambda: (tmp_path / "started").exists(), timeout=60)
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(timeout=60)  # its pipes stay open while the command does
        wait_for(lambda: (tmp_path / "asked").exists(), timeout=20)  # told to stop: stopping
        rerun = run_capstack("run", "slow", cwd=tmp_path, timeout=60)
        assert rerun.returncode == 1 and "stage 'slow' of " in rerun.stderr and \
            "is already running" in rerun.stderr, rerun.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)


def test_a_training_stage_stopped_with_its_engine_records_itself_stopped(data, tmp_path):
    prepared, grid = data
    write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                     features=[grid], epochs=10_000)
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"train": {
        "cmd": "capstack train exp.yaml --out runs/x", "deps": ["exp.yaml"],
        "outs": ["runs/x"]}}}))
    engine = start("run", "train", cwd=tmp_path)
    state = tmp_path / "runs" / "x" / "state.json"
    try:
        # an epoch done: a run to keep (one stopped before its first checkpoint is removed)
        wait_for(lambda: (state.parent / "last.pt").is_file() and engine.poll() is None,
                 timeout=120)
        os.kill(engine.pid, signal.SIGTERM)
        _, stderr = engine.communicate(timeout=90)
        assert engine.returncode == 143 and "stopped by SIGTERM" in stderr, stderr
        assert json.loads(state.read_text())["state"] == "stopped"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)


def test_two_names_of_one_run_folder_share_its_lock(data, tmp_path):
    prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=10_000)
    (tmp_path / "real").mkdir()
    (tmp_path / "runs").mkdir()
    for name in ("a", "b"):
        (tmp_path / "runs" / name).symlink_to(tmp_path / "real")
    first = start("train", exp, "--out", "runs/a", cwd=tmp_path)
    try:
        wait_for(lambda: first.poll() is None and (tmp_path / "real" / "config.json").is_file(),
                 timeout=120)
        second = run_capstack("train", exp, "--out", "runs/b", "--set", "train.lr=0.1",
                              cwd=tmp_path)
        assert second.returncode == 1
        assert f"training into runs/b is already running: held by pid {first.pid}" in \
            second.stderr, second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)
    assert json.loads((tmp_path / "real" / "config.json").read_text())["train"]["lr"] == 5e-3
