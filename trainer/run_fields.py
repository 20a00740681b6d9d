"""A run folder's JSON files as ``capstack runs`` reads them: a value missing, damaged or of
another type is a note (appended to ``notes``), never an error. Read by trainer/runs.py for
today's files and by trainer/upgrade.py for the files of older runs; imports no torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypeGuard

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json


def read_json_for(path: Path, notes: list[str], what: str) -> dict | None:
    """A json object from ``path``, or None with a note naming what is wrong with it."""
    try:
        value = read_json(path, what)
    except CapstackError as error:
        notes.append(str(error))
        return None
    if not isinstance(value, dict):
        notes.append(f"{path}: expected a JSON object, got {type(value).__name__}")
        return None
    return value


def pick(data: dict, keys: str, kind, path: Path, notes: list[str]):
    """``data[a][b]`` for ``keys`` "a.b" when it has ``kind``; else None and a note."""
    value: Any = data
    for key in keys.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    kinds = (kind,) if isinstance(kind, type) else kind
    if value is None or not isinstance(value, kinds) or isinstance(value, bool):
        notes.append(f"{path}: {keys}: expected {kinds[0].__name__}, got {value!r}")
        return None
    return value


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite_score(data: dict, key: str, path: Path, notes: list[str]) -> float | None:
    """``data[key]`` when a finite number; else None and a note (a NaN is no best score)."""
    value = data.get(key)
    if is_number(value) and math.isfinite(value):
        return value
    notes.append(f"{path}: {key}: expected a finite number, got {value!r}")
    return None


def epoch_number(data: dict, key: str, first: int, path: Path, notes: list[str]) -> int | None:
    """``data[key]`` when a whole number from ``first``; else None and a note."""
    value = data.get(key)
    if is_int(value) and value >= first:
        return value
    notes.append(f"{path}: {key}: expected an epoch number from {first}, got {value!r}")
    return None
