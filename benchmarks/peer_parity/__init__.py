"""Checks that run a peer's own code beside capstack's on the same input (benchmarks/parity.py).

A peer is a checkout the user gives (``--peer DIR``); nothing of it is copied into
capstack. Each peer kind is recognised by a file only it has, and lists the checks
that need it. A check returns :class:`Difference` rows: what was compared, the
largest difference seen, and the bound it must stay within.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common import imports_from


@dataclass
class Difference:
    check: str
    quantity: str
    value: float  # the largest difference seen
    bound: float | None  # None: reported, not held to a bound (a known, stated difference)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.bound is None or self.value <= self.bound


@dataclass(frozen=True)
class PeerKind:
    name: str
    marker: str  # a file inside the checkout that tells this peer apart
    url: str
    checks: tuple[Callable[[Path, Any], list[Difference]], ...]  # (checkout, options)


def recognise(folder: Path, kinds: list[PeerKind]) -> PeerKind:
    for kind in kinds:
        if (folder / kind.marker).is_file():
            return kind
    known = "; ".join(f"{k.name} ({k.url}, has {k.marker})" for k in kinds)
    raise SystemExit(f"{folder}: not a peer checkout this script knows: {known}")


@contextmanager
def importable(folder: Path):
    """The peer's packages importable (first on the import path), and an argv of the program
    name alone so a peer's option parser reads its defaults."""
    argv = sys.argv
    sys.argv = [argv[0]]
    try:
        with imports_from(folder):
            yield
    finally:
        sys.argv = argv
