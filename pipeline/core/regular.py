"""Reading a file the user named: only a regular file is read.

``open`` of a FIFO blocks until a writer comes, and a read of a device (``/dev/zero``) may
never end, so a command given one where it reads a file (a stages file, an experiment, a
dataset json, a run's ``state.json``) would hang until a signal. The file is opened without
blocking and looked at before any read; anything but a regular file is refused, naming the
path and what it is. Opening first and looking at what was opened, rather than ``stat`` then
``open``, leaves no moment in which the path could be swapped for a FIFO.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO, TextIO

from pipeline.core.errors import CapstackError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


def not_regular(mode: int) -> str:
    """``not a regular file (a FIFO)``: what a file of ``mode`` is instead."""
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    return f"not a regular file ({kind})"


class NotRegular(CapstackError):
    """A path the command reads as a file names a FIFO, a device, a socket or a folder."""


def open_regular(path: str | os.PathLike, what: str = "a file") -> BinaryIO:
    """``path`` open for binary reading when it is a regular file (a symbolic link to one
    is one). Anything else is refused as ``PATH: not a regular file (a FIFO), never read
    (expected WHAT)``; ``FileNotFoundError`` and other OS errors are the caller's to name."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    return os.fdopen(_regular_or_closed(fd, path, "never read", what), "rb")


def open_append(path: str | os.PathLike, what: str = "a log") -> TextIO:
    """``path`` open for appending text (made when missing), when it is a regular file: the
    ``open`` of a FIFO for writing would block until a reader comes. Anything else is refused
    as :func:`open_regular` refuses it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as error:
        if error.errno != errno.ENXIO:  # a FIFO no process reads
            raise
        raise NotRegular(f"{os.fspath(path)}: {not_regular(stat.S_IFIFO)}, never written "
                         f"(expected {what})") from None
    return os.fdopen(_regular_or_closed(fd, path, "never written", what), "a", encoding="utf-8")


def _regular_or_closed(fd: int, path: str | os.PathLike, never: str, what: str) -> int:
    """``fd``, made blocking, when it is open on a regular file (opened without blocking, so
    that a FIFO never waited on); otherwise closed and refused naming ``path``."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegular(f"{os.fspath(path)}: {not_regular(mode)}, {never} (expected "
                             f"{what})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def require_regular(path: str | os.PathLike, what: str = "a file") -> None:
    """Refuse ``path`` as :func:`open_regular` does, without opening it: for a file named now
    and read later, whose absence and whose kind are told apart (a FIFO is no missing file).
    ``FileNotFoundError`` and other OS errors are the caller's to name."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegular(f"{os.fspath(path)}: {not_regular(mode)}, never read (expected "
                         f"{what})")


def read_bytes(path: str | os.PathLike, what: str = "a file") -> bytes:
    """The content of the regular file ``path`` (see :func:`open_regular`)."""
    with open_regular(path, what) as f:
        return f.read()


def read_text(path: str | os.PathLike, what: str = "a file") -> str:
    """The UTF-8 text of the regular file ``path``; ``UnicodeDecodeError`` for other bytes
    (the caller names the file: :func:`pipeline.core.errors.not_utf8`)."""
    return read_bytes(path, what).decode("utf-8")


def is_regular_or_absent(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file, a symbolic link (itself, not what it names), or
    nothing: what an output may replace."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return True
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)
