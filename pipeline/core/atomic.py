"""Outputs appear whole or not at all.

Every command writes its outputs under a temporary sibling name and renames
them into place when complete, so a run killed half way leaves nothing that a
later run (or a reader) could take for a finished output.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from pipeline.core.errors import CapstackError, cannot_write, refused_by_disk
from pipeline.core.regular import not_regular, open_regular


def _temp_sibling(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def unused_sibling(path: Path, suffix: str) -> Path:
    """``<path><suffix>``, or ``<path><suffix>.2``, ``.3``... the first that does not exist:
    where something is set aside without replacing what was set aside before."""
    candidate, n = path.with_name(path.name + suffix), 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}{suffix}.{n}")
    return candidate


def replace_path(src: Path, dst: Path) -> None:
    """Move ``src`` onto ``dst``; an existing ``dst`` (file or folder) is swapped out first."""
    if dst.exists() or dst.is_symlink():
        old = _temp_sibling(dst, "old")
        os.replace(dst, old)
        os.replace(src, dst)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        os.replace(src, dst)


# Every folder atomic_dir writes holds this file, naming the command that wrote it: the proof
# that a rerun of that command, replacing the folder, deletes nothing but what it wrote there.
OUTPUT_MARKER = ".capstack-output"
_MARKER_LEAD = "written by capstack"
_MARKER_MAX = 4096  # bytes: the marker is one line; a longer file is something else


def _marker_text(writer: str) -> str:
    return f"{_MARKER_LEAD} {writer}: a rerun of `capstack {writer}` may replace it whole\n"


def writer_of(folder: Path) -> str | None:
    """The command that wrote ``folder``, as its marker names it: ``""`` for the marker of a
    capstack that named none (any of its commands may replace the folder, as before); None
    when the marker is not one capstack writes (not a regular file, or other text)."""
    try:
        with open_regular(folder / OUTPUT_MARKER, "capstack's output marker") as f:
            text = f.read(_MARKER_MAX + 1).decode("utf-8")
    except (OSError, CapstackError, UnicodeDecodeError):
        return None
    if len(text) > _MARKER_MAX or not text.startswith(_MARKER_LEAD):
        return None
    named = text[len(_MARKER_LEAD):].split(":", 1)[0].strip()
    return named if re.fullmatch(r"[a-z][a-z0-9-]*|", named) else None


def check_file_replaceable(path: str | os.PathLike) -> None:
    """Refuse an output file ``path`` that exists and is neither a regular file nor a symbolic
    link (replaced as a link; what it names is untouched): the rename that puts the output in
    place would replace a device node (``/dev/null``), a FIFO or a socket with a file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise CapstackError(f"{path}: {not_regular(mode)}; an output replaces only a regular "
                            f"file: choose another path")


def check_replaceable(path: Path, writer: str, *, force: bool = False,
                      inputs: tuple = ()) -> None:
    """Refuse to let ``path`` be replaced by ``capstack WRITER`` when that would delete what
    that command did not write (a folder without its marker, one another command wrote, a
    file) unless ``force``, and always when an input of the command lies inside it or it is
    a device node, a FIFO or a socket."""
    with contextlib.suppress(FileNotFoundError):
        mode = os.lstat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
            raise CapstackError(f"{path}: {not_regular(mode)}; an output folder replaces only "
                                f"a folder or a file: choose another path")
    for given in inputs:
        inside = Path(given).resolve()
        if inside == path or path in inside.parents:
            raise CapstackError(f"{path}: the output folder holds the input {given}; replacing "
                                f"the folder would delete it: choose another output folder")
    if force or not (path.exists() or path.is_symlink()):
        return
    if not path.is_dir() or path.is_symlink():
        raise CapstackError(f"{path}: exists and is not a folder capstack wrote; choose another "
                            f"output, or pass --force to replace it")
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    if not entries:
        return
    wrote = writer_of(path) if OUTPUT_MARKER in entries else None
    if wrote in ("", writer):
        return
    if wrote is not None:
        raise CapstackError(f"{path}: `capstack {wrote}` wrote it, not `capstack {writer}`; "
                            f"replacing it would delete what {wrote} wrote: choose another "
                            f"output folder, or pass --force to replace it whole")
    shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
    raise CapstackError(f"{path}: exists and capstack did not write it (it holds {shown}); "
                        f"choose another output folder, or pass --force to replace it whole")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, writer: str, *, force: bool = False,
               inputs: tuple = ()):
    """Yield a fresh temporary folder that becomes ``path`` when the block succeeds.

    An existing ``path`` is replaced only when ``capstack WRITER`` wrote it (its marker), it
    is empty, or ``force``; never when it holds one of the command's ``inputs`` (see
    check_replaceable)."""
    path = Path(path).resolve()  # '.' and 'a/..' name the folder they are
    check_replaceable(path, writer, force=force, inputs=inputs)
    tmp = _temp_sibling(path, "tmp")
    with _named_when_refused(path, tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        try:
            yield tmp
            (tmp / OUTPUT_MARKER).write_text(_marker_text(writer), encoding="utf-8")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        replace_path(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
    """Yield a temporary file path that becomes ``path`` when the block succeeds. An existing
    ``path`` that is not a regular file (a device, a FIFO) is refused before the block runs
    and again before the rename (:func:`check_file_replaceable`)."""
    path = Path(path)
    check_file_replaceable(path)
    tmp = _temp_sibling(path, "tmp")
    with _named_when_refused(path, tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            yield tmp
            check_file_replaceable(path)  # one made while the block ran
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        os.replace(tmp, path)


@contextlib.contextmanager
def _named_when_refused(path: Path, tmp: Path):
    """The disk refusing ``path``'s temporary (full, read-only, denied) as ``PATH: cannot
    write it (why)``, named by the output rather than the temporary; the block has already
    removed the temporary, and ``path`` itself was never touched."""
    try:
        yield
    except OSError as error:
        if refused_by_disk(error, path.parent):
            raise cannot_write(path, error) from None
        raise
