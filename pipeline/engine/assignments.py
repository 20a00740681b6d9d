"""``--set NAME=VALUE`` (and a grid's ``NAME=V1,V2``) read for a stage: the name of one of its
params, the value typed like the param's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.errors import CapstackError, shown, too_deep
from pipeline.engine.stagedecl import Stage, type_name


def parse_assignment(text: str, stage: Stage, path: Path) -> tuple[str, Any]:
    """Parse ``NAME=VALUE`` for ``stage``; the value must keep the param's type."""
    key, value_text = _assigned(text, stage, path)
    return key, coerce_like(stage.params[key], value_text, f"--set {text}")


def _assigned(text: str, stage: Stage, path: Path) -> tuple[str, str]:
    """``NAME=VALUE`` as the name of a param of ``stage`` and the value's text."""
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise CapstackError(f"--set {text}: expected NAME=VALUE")
    if key not in stage.params:
        known = ", ".join(stage.params) or "none"
        raise CapstackError(
            f"--set {text}: stage '{stage.name}' in {path} has no param '{key}' (params: {known})"
        )
    return key, value_text


MAX_VALUES = 100  # values one --set may list for a grid


def parse_values(text: str, stage: Stage, path: Path) -> tuple[str, list[Any]]:
    """Parse ``NAME=VALUE`` or ``NAME=V1,V2,...`` (a grid's axis) for ``stage``: the values,
    each typed like the param, once each, in the given order.

    A number's or a boolean's value never holds a comma (``1,2`` was refused as no number),
    so ``lr=1e-4,5e-4`` (or ``lr=[1e-4, 5e-4]``) lists values. A string's may: ``a,b.yaml`` is
    one path as well as two, and is refused as ambiguous; ``'[a.yaml, b.yaml]'`` (a YAML
    list) lists values, ``'"a,b.yaml"'`` (a YAML quoted string) is the one value. A string
    without a comma is the value as typed, as :func:`parse_assignment` reads it."""
    key, value_text = _assigned(text, stage, path)
    current, where = stage.params[key], f"--set {text}"
    if isinstance(current, str):
        values = [value_text] if "," not in value_text else _string_values(text, key, value_text)
    else:
        items = _listed(value_text, where) if value_text.lstrip().startswith("[") \
            else value_text.split(",")
        values = [coerce_like(current, item, where) for item in items]
    if not values:
        raise CapstackError(f"{where}: names no value")
    if len(values) > MAX_VALUES:
        raise CapstackError(f"{where}: names {len(values)} values, more than the {MAX_VALUES} "
                            f"one --set may list")
    unique: list[Any] = []
    for value in values:
        if not any(type(v) is type(value) and v == value for v in unique):
            unique.append(value)
    return key, unique


def _listed(text: str, where: str) -> list[str]:
    """The items of a YAML flow list, each as its text (typed later, like the param)."""
    try:
        items = yaml.load(text, Loader=yaml.BaseLoader)  # every scalar a string, as typed
    except yaml.YAMLError as e:
        raise CapstackError(f"{where}: not a YAML list ({getattr(e, 'problem', e)})") from None
    except RecursionError:
        raise too_deep(where) from None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise CapstackError(f"{where}: expected a list of values ([a, b]), got {shown(text)}")
    return items


def _string_values(text: str, key: str, value_text: str) -> list[str]:
    """A string param's value holding a comma: the values of a YAML list, or the one value of
    a YAML quoted string; anything else is refused, naming both ways to write it."""
    stripped = value_text.strip()
    if stripped.startswith("["):
        return _listed(stripped, f"--set {text}")
    if len(stripped) > 1 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        try:
            value = yaml.safe_load(stripped)
        except yaml.YAMLError:
            value = None
        if isinstance(value, str):
            return [value]
    parts = ", ".join(p.strip() for p in value_text.split(","))
    raise CapstackError(
        f"--set {text}: '{key}' is a string param, and a string may hold a comma: for a grid of "
        f"values write them as a YAML list (--set '{key}=[{parts}]'); for the one value "
        f"{shown(value_text)}, quote it (--set '{key}=\"{value_text}\"')")


_EXPONENT_FLOAT = re.compile(r"[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+")


def coerce_like(current: Any, text: str, where: str) -> Any:
    """``text`` converted to the type of ``current``, or a CapstackError naming ``where``."""
    if isinstance(current, str):
        return text
    value: Any
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    expected = type_name(current)
    if isinstance(current, bool):
        ok = isinstance(value, bool)
    elif isinstance(current, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:  # float; 1e-4 too (YAML 1.1 reads a float only with a dot, 1.0e-4)
        if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
            value = float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    if not ok:
        raise CapstackError(f'{where}: expected {expected}, got "{text}"')
    return value
