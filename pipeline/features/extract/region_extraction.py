"""``capstack extract-regions``: a dataset's images -> region features in a shared store.

``--arch`` picks a registered region kind (``kinds/``: every kind whose command is
extract-regions); what the kinds share is ``kinds/region_base.py``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import CapstackError
from pipeline.features.detectors.selection import RegionExtractor
from pipeline.features.extract.job import JobResult, extract
from pipeline.features.extract.kinds import EXTRACTORS, kind_of, kinds_of
from pipeline.features.extract.kinds.region_base import COMMAND, RegionKind

DEFAULT_ARCH = "fpn"


def archs() -> list[str]:
    """``--arch``: the registered kinds extract-regions runs."""
    return kinds_of(COMMAND)


def region_kind(arch: str) -> RegionKind:
    if arch not in archs():
        raise CapstackError(f"arch: unknown {arch!r} (choose {', '.join(archs())})")
    return EXTRACTORS.get(arch)


def region_settings(arch: str | None = None, **options):
    """The settings of region kind ``arch`` (its dataclass; None: the default kind) from
    extract-regions' options; an option of another kind is refused, naming the kind's own."""
    return region_kind(arch or DEFAULT_ARCH).settings(**options)


RegionSettings = region_settings  # its name when the settings were one flat dataclass


def build_extractor(s, weights_path: str, weights_md5: str | None = None) -> RegionExtractor:
    """The extractor of the region kind whose settings ``s`` are, weights loaded."""
    return kind_of(s).build(s, weights_path, weights_md5)


def extract_regions(dataset_json: Path, image_root: Path, s, *, batch_size: int = 4,
                    **options) -> JobResult:
    """``capstack extract-regions``: :func:`~pipeline.features.extract.job.extract` with a
    region kind's settings (``options``: out, root, format, pointer, workers, device,
    progress, images_outside_root)."""
    return extract(dataset_json, image_root, s, batch_size=batch_size, **options)
