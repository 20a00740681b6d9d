"""JSON files: read with an error that names the file and the problem, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.core.atomic import atomic_file
from pipeline.core.bulk import gc_paused
from pipeline.core.errors import CapstackError, too_deep
from pipeline.core.regular import read_text


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """The JSON value in ``path``; ``FILE: <what> not found`` / ``not valid JSON (line L column
    C: ...)`` / ``not a regular file (a FIFO), never read (expected the <what>)`` otherwise."""
    try:
        text = read_text(path, f"the {what}")
    except FileNotFoundError:
        raise CapstackError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CapstackError(f"{path}: cannot read {what} ({error})") from None
    try:
        with gc_paused():  # a dataset's json: millions of objects (bulk.py)
            return json.loads(text)
    except json.JSONDecodeError as error:
        raise CapstackError(f"{path}: not valid JSON (line {error.lineno} column {error.colno}: "
                            f"{error.msg})") from None
    except RecursionError:
        raise too_deep(path) from None


def write_json(path: str | os.PathLike, value, indent: int | None = 1) -> Path:
    """``value`` as JSON in ``path`` (a trailing newline), appearing whole or not at all."""
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(value, indent=indent) + "\n")
    return path
