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
import stat
import sys
import time
from pathlib import Path
from typing import Iterable

from pipeline.core.errors import CapstackError
from pipeline.core.regular import not_regular, open_regular

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
        with open_regular(lock_path, "a lock file") as f:
            info = json.loads(f.read(_HOLDER_MAX) or "{}")
    except (OSError, ValueError, CapstackError):
        info = {}
    if not info:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} since {since} (`{info.get('command')}`)"


_HOLDER_MAX = 64 << 10  # bytes of a lock file read: its holder is one short json line


def _open_lock(lock_path: Path) -> int:
    """The lock file open for reading and writing (made when missing), when it is a regular
    file: a FIFO or a device there (``/dev/zero``) would hold a lock all the same, and its
    holder could never be read (the read would wait, or never end)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CapstackError(f"{lock_path}: {not_regular(mode)}; a lock file is a regular file "
                            f"capstack makes: remove it, then run again")
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def exclusive_run(lock_path: str | os.PathLike, what: str):
    """Hold ``lock_path`` for the block, which gets the lock's descriptor; raise CapstackError
    at once if held. A child process handed the descriptor (the stage engine's keeper) holds
    the lock with it should this process die first."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(lock_path)
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
            yield fd
        finally:
            _HELD.discard(fd)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def holder_now(lock_path: str | os.PathLike) -> str | None:
    """Who holds ``lock_path``'s lock now, as a refusal names them (``pid 4242 on host since
    ...``); None when nobody does, or when it is missing or no regular file. A look: the lock is
    taken (shared, never written) for an instant when it is free."""
    fd = _open_existing(Path(lock_path))
    if fd is None:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe_holder(Path(lock_path))
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding_all(lock_paths: Iterable[str | os.PathLike], what: str):
    """Hold each of ``lock_paths`` that is a regular file for the block, opened read-only
    (nothing written to them): what removes the folder they lie in, so no run starts there
    meanwhile. A CapstackError naming the holder of the first one held: ``{what} is in use:
    LOCK is held by ...``."""
    with contextlib.ExitStack() as held:
        for path in map(Path, lock_paths):
            fd = _open_existing(path)
            if fd is None:
                continue
            held.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CapstackError(f"{what} is in use: {path} is held by "
                                    f"{_describe_holder(path)}; wait for it to finish or stop "
                                    f"it, then run again") from None
        yield


def _open_existing(lock_path: Path) -> int | None:
    """``lock_path`` open read-only when it is a regular file (None otherwise): never made,
    never waited on (a FIFO)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def lock_beside(path: str | os.PathLike) -> Path:
    """``<path>.lock`` beside what ``path`` names once its symbolic links are followed: two
    names of one folder (``runs/a`` and ``runs/b`` linking to ``runs/real``) share one lock."""
    path = Path(path).resolve()
    return path.with_name(path.name + ".lock")


def exclusive_beside(path: str | os.PathLike, what: str):
    """:func:`exclusive_run` on ``<path>.lock`` (:func:`lock_beside`), beside what one run at
    a time writes (a store, a run folder): the lock outlives the path being moved or
    replaced."""
    return exclusive_run(lock_beside(path), what)


@contextlib.contextmanager
def waiting_lock(lock_path: str | os.PathLike):
    """A short exclusive section (read-modify-write of the lock file)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
