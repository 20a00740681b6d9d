"""Feature extraction: images -> a store of features, by a registered extractor kind.

One kind per file, each with its own settings dataclass, registered by name
(``EXTRACTORS``): ``grid`` (ResNet grid features, ``grid.py``), ``fpn``, ``c4``
and ``c5`` (torchvision's Faster R-CNN stacks, ``regions.py``) and ``bottom-up``
(the Visual Genome detector, ``bottom_up.py``). ``extract-grid`` runs the grid
kind, ``extract-regions --arch NAME`` the region kinds (:func:`kinds_of`); a
store records which kind made it, and :func:`maker_of` finds that kind again
(``rebuild.py``, for ``capstack caption``). Adding a kind is one file here plus
its import below. ``job.py`` runs any kind's extraction into a shared store.
"""

from __future__ import annotations

from pipeline.core.errors import CapstackError
from pipeline.core.registry import Registry

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


def maker_of(producer: dict):
    """The kind that made the store whose ``producer`` metadata this is; None if none did."""
    return next((kind for _, kind in EXTRACTORS.items() if kind.made(producer)), None)


from pipeline.features.extract import (bottom_up, grid,  # noqa: E402,F401  (each registers itself)
                                      regions)
