"""The restricted unpickler: plain data in every pickle protocol, nothing else, nothing run."""

from __future__ import annotations

import io
import os
import pickle
import tracemalloc

import numpy as np
import pytest

from pipeline.core import safe_pickle
from pipeline.core.errors import CapstackError
from pipeline.core.safe_pickle import RefusedPickle

PLAIN = {"objects_id": np.arange(5, dtype=np.int64), "conf": np.float32(0.5), "image_h": 480,
         "name": "COCO_val2014_000000000042", "nested": [1, 2.5, (3, b"raw")], "ids": {1, 2},
         "grid": np.asfortranarray(np.ones((2, 3), np.float16))}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_reads_in_every_protocol(protocol):
    value = safe_pickle.loads(pickle.dumps(PLAIN, protocol=protocol), "x.pkl")
    assert value.keys() == PLAIN.keys() and value["nested"] == [1, 2.5, (3, b"raw")]
    for key in ("objects_id", "grid"):
        np.testing.assert_array_equal(value[key], PLAIN[key])


class Shell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("payload", ["os.system", "an object array in an npy", "a class"])
def test_anything_else_is_refused_before_it_runs(payload, tmp_path):
    marker = tmp_path / "ran"
    if payload == "os.system":
        data = pickle.dumps({"info": Shell(marker)})
        load = lambda: safe_pickle.loads(data, "f.pkl")  # noqa: E731
    elif payload == "a class":
        data = pickle.dumps({"when": __import__("datetime").datetime(2020, 1, 1)})
        load = lambda: safe_pickle.loads(data, "f.pkl")  # noqa: E731
    else:
        buffer = io.BytesIO()
        np.save(buffer, np.array([Shell(marker)], dtype=object), allow_pickle=True)
        load = lambda: safe_pickle.load_npy(io.BytesIO(buffer.getvalue()), "f.npy")  # noqa: E731
    with pytest.raises(safe_pickle.RefusedPickle, match=r"f\.(pkl|npy): refusing to unpickle"):
        load()
    assert not marker.exists()


def test_garbage_is_a_clear_error():
    with pytest.raises(CapstackError, match="f.pkl: unreadable pickle"):
        safe_pickle.loads(b"\x80\x04garbage", "f.pkl")
    with pytest.raises(CapstackError, match="f.npz: not an .npz archive"):
        safe_pickle.load_npz(b"PK\x03\x04 truncated", "f.npz")


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_namespace_reads_only_when_asked(protocol):
    """self-critical.pytorch's infos pickle keeps its options in an argparse.Namespace."""
    import argparse

    options = argparse.Namespace(caption_model="updown", rnn_size=512, vocab=None, ids=[1, 2])
    data = pickle.dumps({"opt": options}, protocol=protocol)
    read = safe_pickle.loads(data, "infos.pkl", namespaces=True)["opt"]
    assert type(read) is argparse.Namespace and read == options
    with pytest.raises(safe_pickle.RefusedPickle, match="argparse.Namespace"):
        safe_pickle.loads(data, "infos.pkl")


@pytest.mark.parametrize("kind, size", [(frozenset, 3 * 10 ** 7), (set, 10 ** 8),
                                        (bytearray, 10 ** 10)])
def test_a_tiny_pickle_building_millions_of_elements_is_refused_before_building(kind, size):
    data = _tiny(kind, size)
    assert len(data) < 80
    tracemalloc.start()
    try:
        with pytest.raises(RefusedPickle, match=r"builds more than 4,194,304 elements"):
            safe_pickle.loads(data, "x_info.npy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def _tiny(kind, size: int) -> bytes:
    """How a hostile file spells a huge value in a few bytes: the callable and a range."""
    class Spelled:
        def __reduce__(self):
            return kind, (range(size),)
    return pickle.dumps(Spelled(), protocol=4)


def test_ndarray_called_directly_is_refused():
    class Array:
        def __reduce__(self):
            return np.ndarray, ((10 ** 6, 10 ** 6),)
    with pytest.raises(RefusedPickle, match="calls numpy.ndarray directly"):
        safe_pickle.loads(pickle.dumps(Array()), "x")


def test_an_object_array_with_fewer_values_than_its_shape_is_refused_not_a_crash():
    """numpy 2.4 crashes (SIGSEGV) on such a state: the unpickler checks it first."""
    data = pickle.dumps(np.array([1, 2, 3], dtype=object), protocol=2)
    short = data.replace(b"K\x03\x85", b"K\x09\x85")  # the shape (3,) -> (9,), values kept
    assert short != data
    with pytest.raises(RefusedPickle, match=r"object array of shape \[9\] pickled with 3 values"):
        safe_pickle.loads(short, "x")
    np.testing.assert_array_equal(safe_pickle.loads(data, "x"), [1, 2, 3])


def test_a_dtype_with_fields_beyond_its_size_is_refused():
    data = pickle.dumps(np.zeros(2, np.dtype([("a", "f4"), ("b", "f4")])), protocol=2)
    with pytest.raises(RefusedPickle, match="dtype with fields or a subarray"):
        safe_pickle.loads(data, "x")


def test_an_npy_header_length_flipped_to_gigabytes_is_named_without_reading_them(tmp_path):
    data = bytearray(io.BytesIO(_npy(np.zeros(3, np.float32))).getvalue())
    data[8:10] = (0xFFFF).to_bytes(2, "little")
    with pytest.raises(CapstackError, match=r"its header declares 65,535 bytes; numpy writes"):
        safe_pickle.load_npy(io.BytesIO(bytes(data)), "x.npy")
    huge = _npy(np.zeros(3, np.float32)).replace(b"(3,)", b"(10000000000,)")
    with pytest.raises(CapstackError, match=r"declares an array of shape \[10000000000\]"):
        safe_pickle.load_npy(io.BytesIO(huge), "x.npy")


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()
