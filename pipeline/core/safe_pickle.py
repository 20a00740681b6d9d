"""Reading pickles and ``.npy``/``.npz`` files from other toolkits without running their code.

Several feature formats hold pickles: MILVLG's ``info`` dict inside each npz,
MMF's per-image dicts, lmdbdict's reserved entries. A pickle can name any
callable and have it called, so ``pickle.load`` or ``np.load(allow_pickle=True)``
on a file a user downloaded would run whatever it says. Here a pickle may build
only plain containers (dict, list, tuple, set), numbers, strings, bytes and
numpy arrays, dtypes and scalars; anything else is refused, naming the file and
the key, before it is called.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from typing import IO

import numpy as np

from pipeline.core.errors import CapstackError

# (module, name) a pickle may load: what numpy arrays, dtypes, scalars and plain Python
# values pickle to (numpy 1 and 2 spell the array module differently).
ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),  # protocol 5
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
    ("builtins", "complex"), ("builtins", "slice"), ("builtins", "range"),
    ("_codecs", "encode"),  # how protocol 2 spells bytes
    ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
    ("__builtin__", "set"), ("__builtin__", "frozenset"),
}
# copyreg._reconstructor calls its first argument: only with a class admitted below.
_RECONSTRUCTABLE = {np.ndarray, object}


class RefusedPickle(CapstackError):
    """A pickle that asked for something other than plain data."""


class _PlainDataUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], where: str):
        super().__init__(file, encoding="latin1")  # Python 2 pickles: str -> bytes as latin1
        self.where = where

    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED:
            raise RefusedPickle(f"{self.where}: refusing to unpickle {module}.{name}: only plain "
                                f"containers, numbers, strings and numpy arrays are read from "
                                f"feature files (nothing in them is run)")
        found = super().find_class(module, name)
        if (module, name) in (("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor")):
            return _checked_reconstructor(found, self.where)
        return found

    def persistent_load(self, pid):
        raise RefusedPickle(f"{self.where}: refusing a pickle with persistent ids")


def _checked_reconstructor(reconstructor, where: str):
    def call(cls, base, state):
        if cls not in _RECONSTRUCTABLE or base not in _RECONSTRUCTABLE:
            raise RefusedPickle(f"{where}: refusing to rebuild a {cls!r} from a pickle")
        return reconstructor(cls, base, state)
    return call


def loads(data: bytes, where: str):
    """The plain data a pickle holds; :class:`RefusedPickle` for anything else."""
    return load(io.BytesIO(data), where)


def load(file: IO[bytes], where: str):
    try:
        return _PlainDataUnpickler(file, where).load()
    except RefusedPickle:
        raise
    except Exception as error:  # a truncated or garbled pickle
        raise CapstackError(f"{where}: unreadable pickle ({type(error).__name__}: "
                            f"{error})") from None


def load_npy(file: IO[bytes], where: str) -> np.ndarray:
    """An ``.npy`` array; one of Python objects (a pickle inside) is read as plain data."""
    try:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
    except (ValueError, EOFError) as error:
        raise CapstackError(f"{where}: not an .npy array ({error})") from None
    if dtype.hasobject:
        value = load(file, where)
        if not isinstance(value, np.ndarray):
            raise CapstackError(f"{where}: the pickle inside is not an array")
        return value
    count = int(np.prod(shape, dtype=np.int64))
    data = file.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise CapstackError(f"{where}: .npy array truncated ({len(data)} of "
                            f"{count * dtype.itemsize} bytes)")
    array = np.frombuffer(data, dtype, count)
    order = "F" if fortran else "C"
    return array.reshape(shape[::-1]).T if order == "F" else array.reshape(shape)


def load_npz(source: str | bytes | IO[bytes], where: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (a path, its bytes, or an open file), by name."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(source)
    try:
        with zipfile.ZipFile(source) as archive:
            return {_member_name(name): load_npy(io.BytesIO(archive.read(name)),
                                                 f"{where}[{_member_name(name)}]")
                    for name in archive.namelist()}
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CapstackError(f"{where}: not an .npz archive ({error})") from None


def load_array(data: bytes, where: str) -> np.ndarray | dict[str, np.ndarray]:
    """``.npz`` bytes (a zip) -> its arrays; ``.npy`` bytes -> the array."""
    if data[:2] == b"PK":
        return load_npz(data, where)
    return load_npy(io.BytesIO(data), where)


def _member_name(name: str) -> str:
    return name[:-4] if name.endswith(".npy") else name
