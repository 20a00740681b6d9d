"""Pointer files: a small json naming a shared store, written as a stage's out."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json, write_json


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
