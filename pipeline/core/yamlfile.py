"""YAML a user wrote: bounded once its aliases are expanded, and shown in bounded words.

YAML's aliases let a few hundred bytes name a value of billions: ``&a [x, x, ...]``, then
``&b [*a, *a, ...]``, nine levels deep. The loader shares what an alias names, so the
loaded value is small, but a walk over it (a check, a merge, a message that shows it) meets
every use. Every YAML capstack reads from a user (a stages file, an experiment, a ``--set``
value, an experiment's manifest) is walked once here, counting each use, and refused past
:data:`MAX_VALUES` values or :data:`MAX_TEXT` characters of text: in as many steps as the
bound, whatever the file would expand to. A message showing a value shows it in bounded
words (:func:`pipeline.core.errors.shown`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.core.errors import CapstackError
from pipeline.core.regular import open_regular

MAX_VALUES = 100_000  # values once the aliases are expanded; a stages file holds ~1,000
MAX_TEXT = 16 << 20  # characters of the strings and keys met on the way


def check_expanded(value: Any, where: str, what: str) -> Any:
    """``value`` when its expansion (each alias once per use) stays within the bounds; else
    ``WHERE: more than 100000 values once its YAML aliases are expanded (an alias bomb?);
    WHAT is far smaller``. Stops as soon as a bound is passed."""
    values = text = 0
    stack = [value]
    while stack:
        item = stack.pop()
        values += 1
        if isinstance(item, (str, bytes)):
            text += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
        if values > MAX_VALUES:
            raise CapstackError(f"{where}: more than {MAX_VALUES} values once its YAML aliases "
                                f"are expanded (an alias bomb?); {what} is far smaller")
        if text > MAX_TEXT:
            raise CapstackError(f"{where}: more than {MAX_TEXT >> 20} MiB of text once its YAML "
                                f"aliases are expanded (an alias bomb?); {what} is far smaller")
    return value


# -- extends: OTHER.yaml --------------------------------------------------------------------
EXTENDS_READ_BYTES = 1 << 20  # a file another extends is an experiment: a few hundred bytes


def extended_file(path: Path) -> Path | None:
    """The file ``path`` extends (its top-level ``extends: OTHER.yaml``, relative to its
    folder, as trainer/config.py reads an experiment), or None: no such key, or a file that is
    not a small regular YAML mapping (the command that reads it says what is wrong)."""
    if path.suffix not in (".yaml", ".yml"):
        return None
    try:
        with open_regular(path, "a YAML file") as f:
            text = f.read(EXTENDS_READ_BYTES + 1)
        if len(text) > EXTENDS_READ_BYTES:
            return None
        data = check_expanded(yaml.safe_load(text.decode("utf-8")), str(path), "a YAML file")
    except (OSError, CapstackError, UnicodeDecodeError, yaml.YAMLError, RecursionError,
            ValueError):
        return None
    base = data.get("extends") if isinstance(data, dict) else None
    return (path.parent / base).resolve() if isinstance(base, str) and base else None


def extends_chain(path: Path, limit: int = 64) -> list[Path]:
    """The files ``path`` extends, the nearest first, each once (a cycle ends the chain; the
    command reading it refuses the cycle)."""
    chain: list[Path] = []
    base = extended_file(path)
    while base is not None and base not in chain and len(chain) < limit:
        chain.append(base)
        base = extended_file(base)
    return chain
