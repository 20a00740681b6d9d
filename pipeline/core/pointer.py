"""Pointer files: a small json naming a shared store, written as a stage's out.

The stage's out is the pointer, inside the workdir; the store it names lives
in the shared features root. So a stage is up to date only while both are
there: the stages engine asks :func:`target_of` for what an out stands for.
A reader never dereferences one itself: ``open_store`` accepts a pointer file
(:func:`read_pointer`, once, there). Here in core, below the stores and the
stage engine alike.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json, write_json

MAX_POINTER_BYTES = 64 << 10  # a pointer is two short fields; a larger .json is something else


def write_pointer(pointer: Path, store: Path, fp: str) -> None:
    write_json(pointer, {"store": str(Path(store).resolve()), "fingerprint": fp})


def read_pointer(pointer: str | Path) -> Path:
    """The store a pointer file names (a store path is accepted as is)."""
    pointer = Path(pointer)
    if pointer.suffix != ".json":
        return pointer
    data = read_json(pointer, "store pointer")
    if not isinstance(data, dict) or not isinstance(data.get("store"), str):
        raise CapstackError(f"{pointer}: not a store pointer (expected {{\"store\": ...}})")
    return Path(data["store"])


def target_of(path: Path) -> Path | None:
    """The store ``path`` points to when it is a pointer file; None for any other file. A
    .json larger than a pointer can be (a dataset's captions, 100 MB for COCO) is not read:
    every stage check asks this of every dep and out."""
    if path.suffix != ".json" or not path.is_file() or path.stat().st_size > MAX_POINTER_BYTES:
        return None
    try:
        return read_pointer(path)
    except CapstackError:
        return None
