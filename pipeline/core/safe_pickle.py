"""Reading pickles and ``.npy``/``.npz`` files from other toolkits without running their code.

Several feature formats hold pickles: MILVLG's ``info`` dict inside each npz,
MMF's per-image dicts, lmdbdict's reserved entries. A pickle can name any
callable and have it called, so ``pickle.load`` or ``np.load(allow_pickle=True)``
on a file a user downloaded would run whatever it says. Here a pickle may build
only plain containers (dict, list, tuple, set), numbers, strings, bytes and
numpy arrays, dtypes and scalars; anything else is refused, naming the file and
the key, before it is called. A caller that reads a file known to hold an
``argparse.Namespace`` (self-critical.pytorch's ``infos`` pickle keeps its options in one) asks
for it (``namespaces=True``): a Namespace then builds as an empty object whose attributes are
set from a dict of plain values, and nothing of argparse runs.
"""

from __future__ import annotations

import argparse
import io
import math
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
# copyreg._reconstructor calls base.__new__(cls, state): only a bare object (ndarray.__new__
# would allocate whatever shape the state says).
_RECONSTRUCTABLE: set[type] = {object}
NAMESPACE = ("argparse", "Namespace")  # read only when the caller asks (namespaces=True)
OBJECT = {("builtins", "object"), ("__builtin__", "object")}  # with it, as protocols 0, 1 need


MAX_BUILT = 1 << 22  # elements a pickle may make from a few bytes (range, bytearray(n), sets)
MAX_ARRAY_BYTES = 1 << 28  # one array a feature file declares (BUTD's 100 x 2048 is 0.8 MB)


class RefusedPickle(CapstackError):
    """A pickle that asked for something other than plain data."""


class _PlainDataUnpickler(pickle._Unpickler):
    """Python's own unpickler, whose steps can be watched: which callables a pickle names
    (:data:`ALLOWED` only), what they are asked to build (at most :data:`MAX_BUILT`
    elements: a 48-byte ``frozenset(range(3e7))`` is refused, not built), and the state an
    array or a dtype is given (``BUILD``): numpy trusts it, and an object array shorter
    than its shape, or a field beyond its dtype's size, corrupts memory."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: IO[bytes], where: str, namespaces: bool = False):
        super().__init__(file, encoding="latin1")  # Python 2 pickles: str -> bytes as latin1
        self.where = where
        self.built = 0
        self.namespaces = namespaces

    def find_class(self, module: str, name: str):
        if self.namespaces and (module, name) == NAMESPACE:
            return argparse.Namespace
        if self.namespaces and (module, name) in OBJECT:  # protocols 0, 1: the Namespace's base
            return object
        if (module, name) not in ALLOWED:
            raise RefusedPickle(f"{self.where}: refusing to unpickle {module}.{name}: only plain "
                                f"containers, numbers, strings and numpy arrays are read from "
                                f"feature files (nothing in them is run)")
        found = super().find_class(module, name)
        if name == "_reconstructor":
            return _checked_reconstructor(found, self.where, self.namespaces)
        if name == "_reconstruct":
            return self._reconstruct(found)
        if name == "ndarray":
            return _ARRAY_TYPE
        if name in _COUNTED:
            return self._counted(found, _COUNTED[name])
        return found

    def charge(self, elements: int) -> None:
        self.built += elements
        if self.built > MAX_BUILT:
            raise RefusedPickle(f"{self.where}: refusing a pickle that builds more than "
                                f"{MAX_BUILT:,} elements from ranges, sets or byte arrays "
                                f"(a few bytes asking for gigabytes)")

    def _counted(self, make, size):
        def call(*args):
            self.charge(size(*args))
            return make(*args)
        return call

    def _reconstruct(self, reconstruct):
        def call(subtype, shape, dtype):
            if subtype is not _ARRAY_TYPE and subtype is not np.ndarray:
                raise RefusedPickle(f"{self.where}: refusing to rebuild a {subtype!r} as an array")
            if shape != (0,):
                raise RefusedPickle(f"{self.where}: an array pickled with the shape {shape!r}, "
                                    f"numpy pickles (0,) and sets the shape with its state")
            return reconstruct(np.ndarray, shape, dtype)
        return call

    def load_build(self):
        inst, state = self.stack[-2], self.stack[-1]
        if isinstance(inst, np.ndarray):
            _check_array_state(state, self.where)
        elif isinstance(inst, np.dtype):
            _check_dtype_state(state, self.where)
        elif type(inst) is argparse.Namespace:
            _check_namespace_state(state, self.where)
        else:
            raise RefusedPickle(f"{self.where}: refusing to set the state of a "
                                f"{type(inst).__name__}")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build  # type: ignore[assignment]  # typeshed: Unpickler's only

    def load_newobj(self):
        """``cls.__new__(cls, *args)`` (protocol 2 and up): an empty Namespace only."""
        args, cls = self.stack[-1], self.stack[-2]
        if cls is not argparse.Namespace or args:
            raise RefusedPickle(f"{self.where}: refusing to create a {cls!r} from a pickle")
        super().load_newobj()

    dispatch[pickle.NEWOBJ[0]] = load_newobj  # type: ignore[assignment]

    def persistent_load(self, pid):
        raise RefusedPickle(f"{self.where}: refusing a pickle with persistent ids")


def _range_length(*args) -> int:
    try:
        return len(range(*args))
    except (OverflowError, TypeError, ValueError):
        return MAX_BUILT + 1  # beyond any bound, or not a range (refused as such by range)


def _sized(values=(), *rest) -> int:
    if isinstance(values, int) and not isinstance(values, bool):
        return max(values, 0)  # bytearray(n): n zero bytes
    try:
        return len(values)
    except TypeError:
        return MAX_BUILT + 1  # an iterable of unknown size (a generator) is not plain data


_COUNTED = {"range": _range_length, "set": _sized, "frozenset": _sized, "bytearray": _sized}


class _ArrayType:
    """What ``numpy.ndarray`` unpickles to: passed to ``_reconstruct`` as numpy pickles do,
    never called (``ndarray(shape)`` would allocate a shape the file only declares)."""

    def __call__(self, *args, **kwargs):
        raise RefusedPickle("refusing a pickle that calls numpy.ndarray directly (numpy's own "
                            "pickles rebuild arrays with _reconstruct)")


_ARRAY_TYPE = _ArrayType()


def _check_array_state(state, where: str) -> None:
    """``ndarray.__setstate__``'s argument: (version,) shape, dtype, fortran, data, with data
    exactly as large as the shape says (numpy does not check an object array's list)."""
    if not isinstance(state, tuple) or len(state) not in (4, 5):
        raise RefusedPickle(f"{where}: an array's pickled state is not numpy's")
    shape, dtype, _, data = state[-4:]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise RefusedPickle(f"{where}: an array's pickled shape {shape!r} is not a shape")
    if not isinstance(dtype, np.dtype):
        raise RefusedPickle(f"{where}: an array's pickled dtype is a {type(dtype).__name__}")
    count = math.prod(shape)
    if dtype.hasobject:
        if dtype.kind != "O" or not isinstance(data, list) or len(data) != count:
            raise RefusedPickle(f"{where}: an object array of shape {list(shape)} pickled with "
                                f"{len(data) if isinstance(data, list) else 'no'} values")
    elif not isinstance(data, (bytes, bytearray)) or len(data) != count * dtype.itemsize:
        raise RefusedPickle(f"{where}: an array of shape {list(shape)} and dtype {dtype} "
                            f"pickled with other than its {count * dtype.itemsize} bytes")


def _check_dtype_state(state, where: str) -> None:
    """A dtype's pickled state: a plain dtype only (no fields or subarrays, whose offsets and
    shapes numpy would trust)."""
    if not isinstance(state, tuple) or len(state) < 5 or state[0] not in (3, 4) \
            or any(part is not None for part in state[2:5]):
        raise RefusedPickle(f"{where}: refusing a pickled dtype with fields or a subarray "
                            f"(feature files hold plain numeric arrays)")


def _check_namespace_state(state, where: str) -> None:
    """A Namespace's pickled state: its attributes, a dict of names (the values are plain
    data, the only kind this unpickler builds)."""
    if not isinstance(state, dict) or not all(isinstance(k, str) and k.isidentifier()
                                              for k in state):
        raise RefusedPickle(f"{where}: a Namespace pickled with other than a dict of names")


def _checked_reconstructor(reconstructor, where: str, namespaces: bool = False):
    classes = _RECONSTRUCTABLE | ({argparse.Namespace} if namespaces else set())

    def call(cls, base, state):
        if cls not in classes or base not in _RECONSTRUCTABLE or state is not None:
            raise RefusedPickle(f"{where}: refusing to rebuild a {cls!r} from a pickle")
        return reconstructor(cls, base, state)
    return call


def loads(data: bytes, where: str, namespaces: bool = False):
    """The plain data a pickle holds; :class:`RefusedPickle` for anything else.
    ``namespaces``: an ``argparse.Namespace`` of plain values is plain data too."""
    return load(io.BytesIO(data), where, namespaces)


def load(file: IO[bytes], where: str, namespaces: bool = False):
    try:
        return _PlainDataUnpickler(file, where, namespaces).load()
    except RefusedPickle:
        raise
    except Exception as error:  # a truncated or garbled pickle
        raise CapstackError(f"{where}: unreadable pickle ({type(error).__name__}: "
                            f"{error})") from None


def load_npy(file: IO[bytes], where: str) -> np.ndarray:
    """An ``.npy`` array; one of Python objects (a pickle inside) is read as plain data."""
    try:
        version = np.lib.format.read_magic(file)
        _check_header_length(file, version, where)
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
    count = math.prod(shape)
    if count * dtype.itemsize > MAX_ARRAY_BYTES:
        raise CapstackError(f"{where}: declares an array of shape {list(shape)} "
                            f"({count * dtype.itemsize / 2**20:,.0f} MiB), beyond the "
                            f"{MAX_ARRAY_BYTES >> 20} MiB one feature array may take")
    data = file.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise CapstackError(f"{where}: .npy array truncated ({len(data)} of "
                            f"{count * dtype.itemsize} bytes)")
    array = np.frombuffer(data, dtype, count)
    order = "F" if fortran else "C"
    return array.reshape(shape[::-1]).T if order == "F" else array.reshape(shape)


MAX_HEADER = 10_000  # numpy writes headers of a few hundred bytes, and reads up to this


def _check_header_length(file: IO[bytes], version: tuple[int, int], where: str) -> None:
    """The header length an ``.npy`` declares, bounded before numpy reads that many bytes (a
    flipped bit there asks for gigabytes)."""
    width = 2 if version == (1, 0) else 4
    start = file.tell()
    raw = file.read(width)
    file.seek(start)
    if len(raw) == width:
        length = int.from_bytes(raw, "little")
        if length > MAX_HEADER:
            raise CapstackError(f"{where}: not an .npy array (its header declares {length:,} "
                                f"bytes; numpy writes a few hundred)")


def load_npz(source: str | bytes | IO[bytes], where: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (a path, its bytes, or an open file), by name."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(source)
    try:
        with zipfile.ZipFile(source) as archive:
            for member in archive.infolist():  # sizes the archive declares, before inflating
                if member.file_size > MAX_ARRAY_BYTES + (1 << 16):
                    raise CapstackError(f"{where}[{_member_name(member.filename)}]: inflates to "
                                        f"{member.file_size / 2**20:,.0f} MiB, beyond the "
                                        f"{MAX_ARRAY_BYTES >> 20} MiB one feature array may take")
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
