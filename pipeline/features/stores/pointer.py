"""Pointer files: a small json naming a shared store, written as a stage's out."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.atomic import write_json
from pipeline.core.errors import CapstackError


def write_pointer(pointer: Path, store: Path, fp: str) -> None:
    write_json(pointer, {"store": str(Path(store).resolve()), "fingerprint": fp})


def read_pointer(pointer: str | Path) -> Path:
    """The store a pointer file names (a store path is accepted as is)."""
    pointer = Path(pointer)
    if pointer.suffix != ".json":
        return pointer
    try:
        return Path(json.loads(pointer.read_text())["store"])
    except FileNotFoundError:
        raise CapstackError(f"{pointer}: store pointer not found") from None
    except (ValueError, KeyError, TypeError):
        raise CapstackError(f"{pointer}: not a store pointer (expected {{\"store\": ...}})") \
            from None
