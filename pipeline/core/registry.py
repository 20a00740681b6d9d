"""Components found by name: ``@DECODERS.register("top_down")``, then ``DECODERS.get(name)``.

A registry sits beside what it holds (``trainer/decoders/__init__.py`` holds
``DECODERS``, ``trainer/objectives/__init__.py`` ``OBJECTIVES``); the package
imports every module in it (:func:`import_modules`) so each registers itself,
and adding a component is one new file.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Iterable, Iterator, TypeVar

from pipeline.core.errors import CapstackError

T = TypeVar("T")


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, object] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise CapstackError(f"{self.kind} {name!r} is registered twice "
                                    f"({self._items[name]!r} and {obj!r})")
            self._items[name] = obj
            return obj
        return add

    def get(self, name: str):
        if name not in self._items:
            raise CapstackError(f"unknown {self.kind} {name!r} (choose {', '.join(sorted(self))})")
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def items(self):
        return sorted(self._items.items())

    def summaries(self) -> list[tuple[str, str]]:
        """(name, the first paragraph of its docstring, on one line) per registered component,
        by name: a summary may be wrapped over several lines."""
        return [(name, " ".join((getattr(obj, "__doc__", None) or "").strip()
                                .split("\n\n")[0].split()))
                for name, obj in self.items()]


def import_modules(package: str, path: Iterable[str]) -> None:
    """Import every module of ``package`` (its ``__name__`` and ``__path__``): each registers
    what it defines, so a new file needs no line elsewhere."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")


def names_at(source: str) -> tuple[str, ...]:
    """The names ``source`` (``"module:NAME"``) keeps in one place: a list, a dict, a registry,
    or a function returning one (a command's choices: pipeline/commandline.py's NamesOf). Its
    module is imported by that name, here as in :func:`import_modules`, the one file that
    does so."""
    module, _, name = source.partition(":")
    names = getattr(importlib.import_module(module), name)
    return tuple(names() if callable(names) else names)
