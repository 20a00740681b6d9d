"""A qualitative figure for a paper: K images in a grid, each with two systems' captions under
it (A's above B's, each led by its system's name, in its colour), as papers' qualitative
figures show them. Written as PNG and PDF (vector text), each whole or not at all.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from trainer.evaluation.figures import render  # noqa: F401 - the Agg renderer, no display

COLUMNS = 4  # images per row of the figure, at most
CELL = 2.4  # inches: an image's width in the figure
WRAP = 34  # characters of a caption line under a CELL-wide image at FONT points
FONT = 7.5
COLOURS = ("#1b6ac9", "#c0392b")  # A's, B's: the page's
PRINT_DPI = 200  # the PNG's pixels per inch (the PDF's text and layout are vectors)


@dataclass(frozen=True)
class Example:
    """One image of the figure: its file (None: a grey box names it), and each system's
    caption."""

    image_id: int
    image: Path | None
    captions: tuple[str, str]


def _pixels(image: Path | None) -> np.ndarray | None:
    """The image as RGB pixels, None when there is none or it does not open."""
    if image is None:
        return None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(image) as opened:
            return np.asarray(opened.convert("RGB"))
    except (OSError, UnidentifiedImageError, ValueError):
        return None


def _caption_lines(name: str, caption: str) -> list[str]:
    return textwrap.wrap(f"{name}: {caption}", WRAP) or [f"{name}:"]


def qualitative_figure(examples: Sequence[Example], names: tuple[str, str], out_png: Path,
                       out_pdf: Path) -> list[Path]:
    """Draw ``examples`` with the captions of the systems ``names`` into ``out_png`` and
    ``out_pdf``; their paths."""
    if not examples:
        raise CapstackError(f"{out_png}: no images to draw (the two systems' captions are "
                            f"the same on every image)")
    lines = [[_caption_lines(n, c) for n, c in zip(names, e.captions)] for e in examples]
    text_rows = max(sum(len(side) for side in pair) for pair in lines)
    columns = min(COLUMNS, len(examples))
    grid_rows = math.ceil(len(examples) / columns)
    text_height = (text_rows + 0.6) * FONT * 1.35 / 72  # inches
    cell_height = CELL * 0.8 + text_height
    fig = Figure(figsize=(columns * CELL, grid_rows * cell_height))
    for k, (example, captions) in enumerate(zip(examples, lines)):
        row, column = divmod(k, columns)
        top = 1 - row / grid_rows
        height = CELL * 0.8 / (grid_rows * cell_height)
        ax = fig.add_axes((column / columns + 0.01, top - height, 1 / columns - 0.02, height))
        ax.set_axis_off()
        pixels = _pixels(example.image)
        if pixels is None:
            ax.add_patch(_box(ax))
            ax.text(0.5, 0.5, f"image {example.image_id}", ha="center", va="center",
                    fontsize=FONT, color="#666", transform=ax.transAxes)
        else:
            ax.imshow(pixels)
        y = top - height - 0.15 * FONT / 72 / (grid_rows * cell_height)
        for side, side_lines in enumerate(captions):
            for line in side_lines:
                fig.text(column / columns + 0.015, y, line, fontsize=FONT, va="top",
                         color=COLOURS[side])
                y -= FONT * 1.35 / 72 / (grid_rows * cell_height)
    for path, kind in ((out_png, "png"), (out_pdf, "pdf")):
        with atomic_file(path) as tmp:
            fig.savefig(tmp, format=kind, dpi=PRINT_DPI)
    return [Path(out_png), Path(out_pdf)]


def _box(ax):
    """A grey box in place of an image capstack does not know."""
    from matplotlib.patches import Rectangle

    return Rectangle((0, 0), 1, 1, facecolor="#eee", edgecolor="#ccc", transform=ax.transAxes)
