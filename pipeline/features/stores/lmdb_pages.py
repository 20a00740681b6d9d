"""How long an LMDB data file must be, read from its own meta pages before it is mapped.

LMDB maps ``data.mdb`` into memory. A file cut short (a copy that stopped, a
full disk) maps without complaint, and the first read past its end kills the
process with SIGBUS: no exception, no message, in every command that reads the
store. The two meta pages at the start of the file each hold a transaction id
and the last page in use; the newer one says how many bytes the file needs.
Checking costs one small read (the layout is LMDB's on-disk format, version 1,
64-bit: ``MDB_meta`` after a 16-byte page header).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from pipeline.core.errors import CapstackError

MAGIC = 0xBEEFC0DE
_PAGE_HEADER = 16
_PAGE_SIZE_AT = _PAGE_HEADER + 24  # the free DB's md_pad holds the page size
_LAST_PAGE_AT = _PAGE_HEADER + 120  # mm_last_pg, then mm_txnid


def required_size(data_file: Path) -> int:
    """Bytes the newest committed transaction of ``data_file`` needs; CapstackError when its
    meta pages are not LMDB's."""
    with open(data_file, "rb") as f:
        head = f.read(_LAST_PAGE_AT + 16)
        if len(head) < _LAST_PAGE_AT + 16 or struct.unpack_from("<I", head, 16)[0] != MAGIC:
            raise CapstackError(f"{data_file}: not an LMDB data file (no LMDB meta page at its "
                                f"start): damaged or truncated")
        page_size = struct.unpack_from("<I", head, _PAGE_SIZE_AT)[0]
        f.seek(page_size)
        second = f.read(_LAST_PAGE_AT + 16)
    metas = [head] + ([second] if len(second) == len(head) else [])
    newest = max((struct.unpack_from("<QQ", m, _LAST_PAGE_AT) for m in metas
                  if struct.unpack_from("<I", m, 16)[0] == MAGIC), key=lambda m: m[1])
    return (newest[0] + 1) * page_size


def check_complete(data_file: str | os.PathLike) -> None:
    """CapstackError naming the file when it is shorter than its last transaction needs."""
    data_file = Path(data_file)
    try:
        size = data_file.stat().st_size
        needed = required_size(data_file)
    except OSError as e:
        raise CapstackError(f"{data_file}: cannot read ({e.strerror or e})") from None
    if size < needed:
        raise CapstackError(f"{data_file}: truncated LMDB store: the file has {size} bytes and "
                            f"its last transaction needs {needed}; restore it or extract again")
