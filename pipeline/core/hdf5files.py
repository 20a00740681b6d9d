"""HDF5 files written without HDF5 ever meeting a full disk.

A write HDF5 cannot finish (no space left, a quota) breaks the library's state of the file:
every later flush fails again, closing raises, the process ends in a segmentation fault as it
exits (status 139), and the file left behind may no longer resume (``addr overflow``). So the
disk's refusal is met outside HDF5:

* a file written at once (prepare's ``captions.h5``) is built in memory
  (:func:`written_whole`) and written by Python, whose refusal is an ordinary ``OSError``;
* a file grown in commits (an HDF5 feature store) checks the room for each commit before it
  writes it (:func:`check_room`), and keeps a :class:`Reserve` beside it: should the disk fill
  anyway (another writer took the room meanwhile, a quota the free space does not show), the
  reserve is given back so that HDF5 can finish what it started, and the file is closed whole
  at its last commit.

h5py is imported by the functions that use it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
from pathlib import Path

from pipeline.core.errors import DISK_REFUSALS

RESERVE = 4 << 20  # bytes: what HDF5 still writes once a commit failed (its caches of the file)
MARGIN = 1 << 20  # bytes left free beyond a commit's estimate (HDF5's index and headers)


def check_room(path: str | os.PathLike, nbytes: int) -> None:
    """Raise ``OSError(ENOSPC)`` naming ``path`` when its disk has less than ``nbytes`` (and
    :data:`MARGIN`) free: HDF5 is never asked to write what the disk cannot take."""
    free = shutil.disk_usage(Path(path).parent).free
    if free < nbytes + MARGIN:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: the next commit needs "
                                    f"{_mib(nbytes + MARGIN)}, {_mib(free)} free", str(path))


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


class Reserve:
    """``size`` bytes allocated in a file at ``path`` while an HDF5 file beside it is written,
    given back (deleted) when HDF5 met a full disk anyway, or when the file is complete."""

    def __init__(self, path: str | os.PathLike, size: int = RESERVE):
        self.path = Path(path)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # pragma: no cover - macOS: written zeros take the room as well
                os.write(fd, bytes(size))
        except BaseException:
            os.close(fd)
            self.release()
            raise
        os.close(fd)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def disk_refusal(error: BaseException) -> OSError | None:
    """HDF5's error for a write the disk refused (full, a quota, read-only: h5py raises it as
    a RuntimeError or an OSError whose text holds ``errno = 28``) as a plain ``OSError`` of
    that errno; None for another error."""
    number = error.errno if isinstance(error, OSError) else None
    if number not in DISK_REFUSALS:
        number = next((n for n in DISK_REFUSALS if f"errno = {n}," in str(error)), None)
    return None if number is None else OSError(number, os.strerror(number))


@contextlib.contextmanager
def written_whole(path: str | os.PathLike):
    """An ``h5py.File`` built in memory, written to ``path`` when the block ends well: the
    disk refusing it is an ``OSError`` of that write, HDF5 having finished long before."""
    import h5py

    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        yield f
    Path(path).write_bytes(image.getvalue())
