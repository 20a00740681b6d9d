"""The one error type a user sees.

Anything that is the user's fault (a malformed file, a bad option, a missing
input) raises :class:`CapstackError` with a message that names the file, the
field and the problem. ``cli.py`` prints such errors on one line and exits with
status 2; every other exception is a bug and keeps its traceback.
"""

import errno
import reprlib
from typing import Any

# What the disk refuses, whichever file was being written: no room, no quota, mounted read-only.
DISK_REFUSALS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class CapstackError(Exception):
    """A problem with the user's input, reported without a traceback."""


def where(path, field: str = "") -> str:
    """``"file: field"`` prefix used at the start of every error message."""
    return f"{path}: {field}" if field else f"{path}"


def not_utf8(path, error: UnicodeDecodeError) -> CapstackError:
    """``FILE: not UTF-8 text (byte N is 0xNN)``: a text file in another encoding."""
    return CapstackError(f"{path}: not UTF-8 text (byte {error.start} is "
                         f"{error.object[error.start]:#x})")


def cannot_write(path, error: OSError) -> CapstackError:
    """``PATH: cannot write it (No space left on device); ...``: the disk refused an output."""
    reason = error.strerror or str(error)
    return CapstackError(f"{path}: cannot write it ({reason}); nothing written before was "
                         f"changed: make room or choose another place, then run again")


def refused_by_disk(error: BaseException, *paths) -> bool:
    """Whether ``error`` is the disk refusing a write (full, read-only, quota), or any OS
    error about one of ``paths`` (permission denied on an output, say)."""
    if not isinstance(error, OSError):
        return False
    if error.errno in DISK_REFUSALS:
        return True
    named = str(error.filename or "")
    return bool(named) and any(named.startswith(str(p)) for p in paths)


def too_deep(path) -> CapstackError:
    """``FILE: nested deeper than ... levels``: JSON or YAML that would exhaust the parser's
    recursion (a crafted file; no capstack file nests more than a few levels)."""
    import sys

    return CapstackError(f"{path}: nested deeper than the {sys.getrecursionlimit()} levels "
                         f"capstack reads")


SHOWN = 200  # characters of a value a message shows


class _ShortRepr(reprlib.Repr):
    """reprlib's bounded repr, which still builds an int's whole repr: one of more than
    4,300 digits raises ValueError (Python's int-to-str limit), so such an int is told by
    its size."""

    def repr_int(self, x, level):
        if x.bit_length() > 4 * SHOWN:  # above ~240 digits: never converted
            return f"<an int of {x.bit_length():,} bits>"
        return super().repr_int(x, level)


_SHOWN = _ShortRepr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, SHOWN, SHOWN
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 8


def shown(value: Any) -> str:
    """``repr(value)`` cut to a few lines' worth: the nesting, the number of items and the
    length of strings it shows are bounded, so a message about a huge value stays short (and
    is made without building the whole repr)."""
    text = _SHOWN.repr(value)
    return text if len(text) <= 4 * SHOWN else text[:4 * SHOWN] + "..."
