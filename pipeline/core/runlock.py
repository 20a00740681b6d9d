"""One run of a stage at a time, and a second one told who holds it.

An exclusive, non-blocking ``flock`` on a small file; the holder writes its
pid, host, start time and command into it so a refused run can name it. The
kernel drops the lock when the holder dies, even by SIGKILL, so a crashed run
never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from pipeline.core.errors import CapstackError

# Locks this process holds, by fd. A forked child (a DataLoader worker) inherits the fds, and
# flock is held while any copy is open: orphan workers of a killed run would keep holding its
# lock for the seconds they take to notice. So every child closes its copies at once.
_HELD: set[int] = set()


def _drop_inherited_locks() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


def _describe_holder(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} since {since} (`{info.get('command')}`)"


@contextlib.contextmanager
def exclusive_run(lock_path: str | os.PathLike, what: str):
    """Hold ``lock_path`` for the block; raise CapstackError at once if held."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CapstackError(
                f"{what} is already running: held by {_describe_holder(lock_path)}; "
                f"wait for it to finish or stop it (lock file {lock_path})"
            ) from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "command": " ".join(["capstack", *sys.argv[1:]]),
        }
        with contextlib.suppress(OSError):  # on a full disk the lock holds all the same
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        _HELD.add(fd)
        try:
            yield
        finally:
            _HELD.discard(fd)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def exclusive_beside(path: str | os.PathLike, what: str):
    """:func:`exclusive_run` on ``<path>.lock``, beside what one run at a time writes (a store,
    a run folder): the lock outlives the path being moved or replaced."""
    path = Path(path)
    return exclusive_run(path.with_name(path.name + ".lock"), what)


@contextlib.contextmanager
def waiting_lock(lock_path: str | os.PathLike):
    """A short exclusive section (read-modify-write of the lock file)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
