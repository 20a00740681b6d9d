"""Content hashes of files and folders, reused while a file is unchanged.

A stage is up to date when the *content* of its deps matches its last run, so
every check hashes its deps and outs. Hashing a 20k-image folder from scratch
takes seconds; re-stating it takes milliseconds. :class:`HashCache` therefore
keeps each file's md5 in a small sqlite table keyed by absolute path and reuses
it while the file's (inode, mtime_ns, size) are unchanged, as dvc-data's state
does. A folder's digest is the md5 of its sorted (relative path, file md5)
list, so renaming, adding or editing any file inside changes it.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_CHUNK = 1 << 20
log = logging.getLogger(__name__)
Progress = Callable[[int], None] | None  # told the bytes of each chunk read


class NotARegularFile(OSError):
    """A path that names a folder, FIFO, socket or device where a file's content is wanted."""


@dataclass(frozen=True)
class Digest:
    """What the lock records of a dep or an out."""

    md5: str
    size: int
    nfiles: int

    def to_dict(self) -> dict:
        return {"md5": self.md5, "size": self.size, "nfiles": self.nfiles}


def md5_of_file(path: str | os.PathLike, progress: Progress = None) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def _walk_files(root: str):
    """Yield (relative path, os.stat_result) of every file below ``root``, sorted."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir)) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.is_dir(follow_symlinks=True):
                subdirs.append(rel)
            elif entry.is_file(follow_symlinks=True):
                yield rel, entry.stat(follow_symlinks=True)
        stack.extend(reversed(subdirs))


class HashCache:
    """md5 digests of files and folders, remembered in ``db_path`` between runs.

    Use as a context manager: new or changed entries are written on exit, in one
    transaction. Several processes may share the same database.
    """

    def __init__(self, db_path: str | os.PathLike | None):
        self._db_path = Path(db_path) if db_path else None
        self._known: dict[str, tuple[int, int, int, str]] = {}
        self._fresh: dict[str, tuple[int, int, int, str]] = {}
        if self._db_path and self._db_path.exists():
            self._load()

    # -- persistence ---------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        assert self._db_path is not None, "only a cache with a file connects"
        con = sqlite3.connect(self._db_path, timeout=60)
        con.execute(
            "CREATE TABLE IF NOT EXISTS files ("
            " path TEXT PRIMARY KEY, inode INTEGER, mtime_ns INTEGER, size INTEGER, md5 TEXT)"
        )
        return con

    def _load(self) -> None:
        try:
            con = self._connect()
            try:
                rows = con.execute("SELECT path, inode, mtime_ns, size, md5 FROM files").fetchall()
            finally:
                con.close()
        except sqlite3.OperationalError as error:  # locked, unreadable: not damaged, unused
            log.warning("%s: hash cache not read (%s): files are hashed again",
                        self._db_path, error)
            return
        except sqlite3.DatabaseError as error:
            self._start_afresh(error)  # a damaged cache only costs a rehash
            return
        self._known = {p: (i, m, s, h) for p, i, m, s, h in rows}

    def _start_afresh(self, error: Exception) -> None:
        """Remove a damaged cache (it holds nothing that cannot be hashed again), and say so."""
        log.warning("%s: damaged hash cache (%s); rebuilt: files are hashed again",
                    self._db_path, error)
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{self._db_path}{suffix}").unlink(missing_ok=True)
        self._known = {}

    def save(self) -> None:
        if not self._db_path or not self._fresh:
            return
        try:
            self._db_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._write_fresh()
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as error:  # damaged since it was read: once afresh
                self._start_afresh(error)
                self._write_fresh()
        except (OSError, sqlite3.OperationalError) as error:  # disk full, read-only, locked
            log.warning("%s: hash cache not saved (%s): these files are hashed again next "
                        "time", self._db_path, error)
            return
        self._known.update(self._fresh)
        self._fresh.clear()

    def _write_fresh(self) -> None:
        con = self._connect()
        try:
            with con:
                con.executemany(
                    "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)",
                    [(p, *v) for p, v in self._fresh.items()],
                )
        finally:
            con.close()

    def __enter__(self) -> "HashCache":
        return self

    def __exit__(self, *exc) -> None:
        self.save()

    # -- hashing -------------------------------------------------------------
    def _file_md5(self, abspath: str, st: os.stat_result, progress: Progress = None) -> str:
        return self._cached(abspath, abspath, st, lambda: md5_of_file(abspath, progress),
                            (lambda: progress(st.st_size)) if progress else None)

    def _cached(self, key: str, abspath: str, st: os.stat_result, compute: Callable[[], str],
                on_hit: Callable[[], None] | None = None) -> str:
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._fresh.get(key) or self._known.get(key)
        if known and known[:3] == stamp:
            if on_hit:
                on_hit()
            return known[3]
        value = compute()
        self._fresh[key] = (*stamp, value)
        return value

    def derived(self, path: str | os.PathLike, name: str, compute: Callable[[Path], str]) -> str:
        """``compute(path)``, a digest of a regular file's content other than its md5 (``name``
        says which: a code digest ignoring comments), remembered like its md5 while the file is
        unchanged."""
        abspath = os.path.abspath(path)
        st = os.stat(abspath)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", abspath)
        return self._cached(f"{name}\0{abspath}", abspath, st, lambda: compute(Path(abspath)))

    def file_md5(self, path: str | os.PathLike) -> str:
        """The md5 of a regular file; :class:`NotARegularFile` for anything else (a FIFO or a
        device would block or never end), before a byte is read."""
        abspath = os.path.abspath(path)
        st = os.stat(abspath)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", abspath)
        return self._file_md5(abspath, st)

    def digest(self, path: str | os.PathLike, progress: Progress = None) -> Digest | None:
        """Digest of a file or a folder; ``None`` when ``path`` does not exist."""
        abspath = os.path.abspath(path)
        if os.path.isfile(abspath):
            st = os.stat(abspath)
            return Digest(self._file_md5(abspath, st, progress), st.st_size, 1)
        if not os.path.isdir(abspath):
            return None
        listing = hashlib.md5()
        size = nfiles = 0
        for rel, st in _walk_files(abspath):
            md5 = self._file_md5(os.path.join(abspath, rel), st, progress)
            listing.update(f"{rel}\0{md5}\n".encode())
            size += st.st_size
            nfiles += 1
        return Digest(listing.hexdigest(), size, nfiles)
