"""Outputs appear whole or not at all.

Every command writes its outputs under a temporary sibling name and renames
them into place when complete, so a run killed half way leaves nothing that a
later run (or a reader) could take for a finished output.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

from pipeline.core.errors import CapstackError, cannot_write, refused_by_disk


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


# Every folder atomic_dir writes holds this file: the proof that replacing the folder deletes
# nothing but what capstack wrote there.
OUTPUT_MARKER = ".capstack-output"
_MARKER_TEXT = "written by capstack: a rerun of the command that wrote it may replace it whole\n"


def check_replaceable(path: Path, *, force: bool = False, inputs: tuple = ()) -> None:
    """Refuse to let ``path`` be replaced when that would delete what capstack did not write
    (a folder without its marker, a file) unless ``force``, and always when an input of the
    command lies inside it."""
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
    if not entries or OUTPUT_MARKER in entries:
        return
    shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
    raise CapstackError(f"{path}: exists and capstack did not write it (it holds {shown}); "
                        f"choose another output folder, or pass --force to replace it whole")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, force: bool = False, inputs: tuple = ()):
    """Yield a fresh temporary folder that becomes ``path`` when the block succeeds.

    An existing ``path`` is replaced only when capstack wrote it (its marker), it is empty, or
    ``force``; never when it holds one of the command's ``inputs`` (see check_replaceable)."""
    path = Path(path).resolve()  # '.' and 'a/..' name the folder they are
    check_replaceable(path, force=force, inputs=inputs)
    tmp = _temp_sibling(path, "tmp")
    with _named_when_refused(path, tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        try:
            yield tmp
            (tmp / OUTPUT_MARKER).write_text(_MARKER_TEXT, encoding="utf-8")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        replace_path(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
    """Yield a temporary file path that becomes ``path`` when the block succeeds."""
    path = Path(path)
    tmp = _temp_sibling(path, "tmp")
    with _named_when_refused(path, tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            yield tmp
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
