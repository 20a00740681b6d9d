"""Running capstack and watching other processes from a test: records committed to a store being
written, waiting, a small disk remounted."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def committed_records(partial: Path) -> int:
    """Records an LMDB store being written has committed so far (0 before it exists)."""
    import lmdb
    if not partial.exists():
        return 0
    try:
        env = lmdb.open(str(partial), readonly=True, lock=False)
    except lmdb.Error:  # seen by glob while the writer was still creating it: nothing yet
        return 0
    try:
        with env.begin() as txn:
            return sum(1 for k in txn.cursor().iternext(values=False) if k.startswith(b"r:"))
    finally:
        env.close()


def wait_for(predicate, timeout=120):
    """``predicate()``'s first true value, polled; AssertionError after ``timeout`` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def run_capstack(*args, cwd: Path, timeout: float = 120, **kw):
    """``capstack ARGS`` in a child process running this source tree's ``cli.py`` (the
    ``capstack`` script on PATH may belong to another install), ended after ``timeout`` s: a
    command that hangs fails the test with ``subprocess.TimeoutExpired``."""
    import subprocess

    from pipeline.core.entry import capstack_command

    return subprocess.run(capstack_command([str(a) for a in args]), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, **kw)


CAPSTACK = str(Path(sys.executable).with_name("capstack"))  # the installed entry point


def capstack(*args, cwd: Path, **kw) -> subprocess.CompletedProcess:
    """The installed ``capstack`` entry point run in ``cwd``, its output captured."""
    return subprocess.run([CAPSTACK, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          **kw)


def remount(where: Path, options: str) -> None:
    """Remount a small_disk tmpfs: ``size=20m``, ``ro``."""
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def last_line(result) -> str:
    """The last line a finished command wrote to stderr (which holds no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


DATA_LIMIT = 1 << 30


def limited(*args, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``capstack ARGS`` with its data limited to 1 GiB and its time to ``timeout`` s."""
    import os
    import resource

    from pipeline.core.entry import capstack_command

    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(capstack_command([str(a) for a in args]), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def alias_bomb(levels: int, leaf: str = "lol", width: int = 9) -> str:
    """A flow sequence of ``width ** (levels + 1)`` leaves once its aliases are expanded, in a
    few hundred bytes: each level is the one below it ``width`` times."""
    text = f"&l0 [{', '.join([leaf] * width)}]"
    for level in range(1, levels + 1):
        text = f"&l{level} [{text}, {', '.join([f'*l{level - 1}'] * (width - 1))}]"
    return text
