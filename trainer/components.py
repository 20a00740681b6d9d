"""A component: a class picked by ``name`` from a registry, with its own config dataclass filled.

An experiment's ``decoder`` and ``objective`` are components, and a component's
config may hold components of its own (SCST's ``reward``, a mix's ``parts``):
a field declared with :func:`component` is read from its registry wherever it
sits (trainer/config.py). This module imports no registry, so a registered
class's config can declare such a field without an import cycle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Component:
    """A component picked by ``name`` from a registry, with its own config dataclass filled."""

    name: str
    config: Any
    beside: Any = None  # the holder's settings beside the component's own (a mix part's weight)

    def to_dict(self) -> dict:
        """Its file form: ``{name: ..., **its settings}``."""
        beside = file_form(self.beside) if self.beside is not None else {}
        return {"name": self.name, **file_form(self.config), **beside}


def component(registry, beside: type | None = None, **kwargs):
    """A ``Component`` field (or ``list[Component]``) read from ``registry``: a mapping with
    ``name``. ``beside``: a config dataclass of keys the holder reads in that same mapping
    besides the component's own (a mix part's ``weight``)."""
    return field(metadata={"registry": registry, "beside": beside}, **kwargs)


def file_form(config) -> dict:
    """A config dataclass as the mapping a yaml file holds (a component as its ``name`` and
    settings, as :meth:`Component.to_dict`; ``dataclasses.asdict`` would nest it otherwise)."""
    return {f.name: _value(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _value(value):
    if isinstance(value, Component):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return file_form(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_value(v) for v in value)
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    return value
