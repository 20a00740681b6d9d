"""The one error type a user sees.

Anything that is the user's fault (a malformed file, a bad option, a missing
input) raises :class:`CapstackError` with a message that names the file, the
field and the problem. ``cli.py`` prints such errors on one line and exits with
status 2; every other exception is a bug and keeps its traceback.
"""


class CapstackError(Exception):
    """A problem with the user's input, reported without a traceback."""


def where(path, field: str = "") -> str:
    """``"file: field"`` prefix used at the start of every error message."""
    return f"{path}: {field}" if field else f"{path}"


def not_utf8(path, error: UnicodeDecodeError) -> CapstackError:
    """``FILE: not UTF-8 text (byte N is 0xNN)``: a text file in another encoding."""
    return CapstackError(f"{path}: not UTF-8 text (byte {error.start} is "
                         f"{error.object[error.start]:#x})")
