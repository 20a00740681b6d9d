"""The restricted unpickler: plain data in every pickle protocol, nothing else, nothing run."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest

from pipeline.core import safe_pickle
from pipeline.core.errors import CapstackError

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
