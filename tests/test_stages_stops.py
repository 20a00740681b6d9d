"""Stopping the stage engine and what it started: a shell's child ends with a killed or stopped
engine, a rerun waits for a stopping command, a stopped training stage records itself stopped,
one run folder's lock under two names, torchrun's processes, and a second SIGTERM ending a
process blocked where no batch ends."""

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

from pipeline.core.entry import capstack_command
from process_helpers import run_capstack, wait_for
from trainer_fixtures import write_experiment


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
    _, prepared, grid, _ = data
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
    _, prepared, grid, _ = data
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


@pytest.mark.slow
def test_torchrun_processes_end_with_a_stopped_nproc_command(tmp_path):
    """``--nproc 2`` stopped by SIGTERM killed torchrun's launcher alone: its two workers went
    on extracting, orphaned."""
    from pipeline.demo.shapes import write_shapes_dataset

    write_shapes_dataset(tmp_path / "shapes", n_train=2000, n_val=1, n_test=1, seed=0, size=64)
    command = start("extract-grid", "shapes/dataset_shapes.json", "shapes", "--backbone",
                    "resnet18", "--weights", "random", "--image-size", "448", "--grid", "2",
                    "--workers", "0", "--batch", "1", "--features-root", "features", "--nproc",
                    "2", cwd=tmp_path)
    workers: list[int] = []
    try:
        def running_workers() -> list[int]:
            """torchrun's processes (``python -u cli.py extract-grid ...``) working here."""
            found = []
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):
                    words = cmdline.read_bytes().split(b"\0")
                    pid = int(cmdline.parent.name)
                    if b"-u" in words and b"extract-grid" in words and alive(pid) and \
                            (cmdline.parent / "cwd").resolve() == tmp_path:
                        found.append(pid)
            return found

        workers = wait_for(lambda: len(running_workers()) == 2 and running_workers(), timeout=120)
        wait_for(lambda: list((tmp_path / "features").glob("*shard*")), timeout=120)
        os.kill(command.pid, signal.SIGTERM)
        _, stderr = command.communicate(timeout=120)
        assert command.returncode == 143 and "stopped by SIGTERM" in stderr, stderr
        wait_for(lambda: not any(alive(pid) for pid in workers), timeout=10)  # minutes of work left
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command.pid, signal.SIGKILL)
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


ROOT = Path(__file__).resolve().parents[1]


BLOCKED = """
import os, sys
sys.path.insert(0, {root!r})
from pipeline.core.interrupt import stop_at_batch_boundary
with stop_at_batch_boundary() as state:
    print("blocking", flush=True)
    os.open({fifo!r}, os.O_RDONLY)  # waits for a writer that never comes
"""


def test_a_second_sigterm_ends_a_process_blocked_where_no_batch_ends(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    process = subprocess.Popen([sys.executable, "-c", BLOCKED.format(root=str(ROOT),
                                                                     fifo=str(tmp_path / "fifo"))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "blocking\n"
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert process.poll() is None  # the first request waits for a batch boundary
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    finally:
        process.kill()
    stderr = process.stderr.read()
    assert process.returncode != 0
    assert "SIGTERM: stopping after the batch in progress (send it again to stop at once)" \
        in stderr
