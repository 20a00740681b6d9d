"""Drawing without a display: matplotlib's Agg renderer on Figure objects, saved whole or not
at all.

Everything draws on :class:`matplotlib.figure.Figure` objects, never through
pyplot, so nothing opens a window or touches pyplot's global figure registry
(figures are freed when they go out of scope).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from pipeline.core.atomic import atomic_file  # noqa: E402

DPI = 100


def save_png(fig: Figure, out: Path) -> Path:
    """Write ``fig`` to ``out`` as PNG so that ``out`` appears whole or not at all."""
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return Path(out)
