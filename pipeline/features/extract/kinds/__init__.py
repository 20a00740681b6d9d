"""Extractor kinds, found by name: one file each, registered in ``EXTRACTORS``.

``grid`` (ResNet grid features, ``grid.py``), ``fpn``, ``c4`` and ``c5``
(torchvision's Faster R-CNN stacks, ``regions.py``) and ``bottom-up`` (the Visual
Genome detector, ``bottom_up.py``); ``base.py`` says what a kind provides.
``extract-grid`` runs the grid kind, ``extract-regions --arch NAME`` the region
kinds (:func:`kinds_of`); a store records which kind made it, and
:func:`maker_of` finds that kind again (``../rebuild.py``, for ``capstack
caption``). Importing this package imports every module in it, so adding a kind
is one new file here.
"""

from __future__ import annotations

import dataclasses

from pipeline.core.errors import CapstackError
from pipeline.core.registry import Registry, import_modules

EXTRACTORS = Registry("extractor")


def kinds_of(command: str) -> list[str]:
    """The names of the kinds ``command`` (extract-grid, extract-regions) runs, sorted."""
    return [name for name, kind in EXTRACTORS.items() if kind.command == command]


def kind_of(settings):
    """The registered kind whose settings dataclass ``settings`` is."""
    for _, kind in EXTRACTORS.items():
        if kind.accepts(settings):
            return kind
    raise CapstackError(f"{settings!r}: the settings of no extractor kind "
                        f"(registered: {', '.join(EXTRACTORS)})")


def setting_defaults(command: str, setting: str) -> dict[str, object]:
    """{kind: the default of its ``setting``} for each kind ``command`` runs that has one
    (what ``--help`` shows: the CLI types no default of its own)."""
    defaults = {}
    for name in kinds_of(command):
        for f in dataclasses.fields(EXTRACTORS.get(name).Settings):
            if f.name == setting and f.init:
                defaults[name] = f.default_factory() if f.default is dataclasses.MISSING \
                    and f.default_factory is not dataclasses.MISSING else f.default
    return defaults


def maker_of(producer: dict):
    """The kind that made the store whose ``producer`` metadata this is; None if none did."""
    return next((kind for _, kind in EXTRACTORS.items() if kind.made(producer)), None)


import_modules(__name__, __path__)  # each file registers its kind(s)
