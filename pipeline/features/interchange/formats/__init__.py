"""The outside feature layouts capstack reads, by name (``capstack import-features FORMAT``)."""

from __future__ import annotations

from pipeline.core.registry import Registry

FORMATS = Registry("feature format")

from pipeline.features.interchange.formats import (  # noqa: E402,F401  (each registers itself)
    bua_npz, butd_tsv, m2_hdf5, mmf, rtl, vinvl_tsv)
