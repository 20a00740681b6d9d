"""Lemmatisers, found by name (``capstack prepare --lemmatize NAME``): one file each.

Each file registers a function with ``@LEMMATIZERS.register(name)`` that returns a
:class:`Lemmatizer` (its package imported, its version read); importing this package
imports every module in it, so adding a lemmatiser is one new file here. A file whose
lemmas depend on an installed distribution names it in a top-level literal
``CODE_DISTRIBUTIONS`` (pipeline/engine/codeversion.py), so that upgrading it makes a
prepare stage stale. pipeline/captions/lemmatize.py says what lemmatising does to a dataset.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Callable

from pipeline.core.registry import Registry, import_modules

LEMMATIZERS = Registry("lemmatizer")
DEFAULT_LEMMATIZER = "simplemma"


@dataclass(frozen=True)
class Lemmatizer:
    name: str  # its name in LEMMATIZERS
    version: str  # the installed version of the package that does the work
    lemma: Callable[[str], str]  # one lowercase word -> its lemma (itself when unknown)

    def record(self) -> dict[str, str]:
        """What the prepared folder records of it."""
        return {"name": self.name, "version": self.version}


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (importlib.metadata), None when absent."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_lemmatizer(name: str) -> Lemmatizer:
    """The registered lemmatiser ``name``, its package imported and its version read."""
    return LEMMATIZERS.get(name)()


import_modules(__name__, __path__)  # each registers itself
