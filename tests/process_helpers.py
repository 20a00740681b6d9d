"""Watching other processes from a test: records committed to a store being written, waiting."""

from __future__ import annotations

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
