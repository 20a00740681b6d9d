"""Attention maps: the image, then one panel per caption word (Show-Attend-Tell's figures), and
Stack-Cap's Figure 3 (a row per stage, coarse to fine).

Grid features draw as a smoothed heat map over the image (resample.py); region features as
their boxes' outlines, never a fill over the image: a caption names colours, and a fill
repaints the very objects it names. One colour scale holds for every panel of a figure (its
colour bar), so panels compare: it runs from 0 to the figure's largest weight, and at least to
four times the even spread's (4 / L), so that attention spread evenly over the image reads as a
faint wash, not as a hot spot over the whole frame. Low weights are transparent: the image shows
through where the decoder did not look. Each panel's title is its word and the weight of its
strongest cell or region.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.patheffects import withStroke

from pipeline.core.errors import CapstackError, where
from trainer.evaluation.figures.render import save_png
from trainer.evaluation.figures.resample import upsampled_attention

PANELS_PER_ROW = 5
PANEL_WIDTH_IN = 2.4
TITLE_HEIGHT_IN = 0.35
COLOUR_BAR_IN = 0.9  # the colour bar and its label, right of the panels
CMAP = colormaps["inferno"]  # dark to bright yellow; perceptually even, readable in grey
HEAT_OPACITY = 0.8  # the heat map's opacity at the top of the scale (0 at weight 0)
EVEN_SPREAD_LEVEL = 4.0  # the scale's top is at least 4 / L (see weight_scale)
BOXES_DRAWN = 8  # a region panel outlines at most the word's 8 heaviest regions ...
BOX_SHARE_DRAWN = 0.02  # ... of at least 2% of its attention each
BOX_LINE_WIDTH = (0.6, 3.5)  # points: a region of weight 0, one at the top of the scale


def figure_image(path: str | os.PathLike) -> np.ndarray:
    """The image file at ``path`` as the feature extractor saw it, H x W x 3 uint8: loaded by the
    extractor's own :func:`~pipeline.vision.images.load_rgb` (EXIF orientation
    applied, alpha on white, 16-bit scaled), so boxes and grid cells, computed on those pixels,
    land where they were. ``Image.open(path).convert("RGB")`` drew an EXIF-rotated photo
    unrotated, under boxes of the rotated one."""
    from pipeline.vision.images import ImageSkipped, load_rgb

    try:
        return np.asarray(load_rgb(path))
    except ImageSkipped as skipped:
        raise CapstackError(f"{os.fspath(path)}: cannot draw attention on it: "
                            f"{skipped.reason}") from None


def _check_image(image: np.ndarray | str | os.PathLike, out: Path) -> np.ndarray:
    if isinstance(image, (str, os.PathLike)):
        return figure_image(image)
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise CapstackError(
            f"{where(out, 'image')} expected an H x W x 3 uint8 array, "
            f"got shape {image.shape} dtype {image.dtype}"
        )
    return image


def _check_alphas(alphas: np.ndarray, n_words: int, out: Path) -> np.ndarray:
    alphas = np.asarray(alphas, dtype=np.float64)
    if alphas.ndim != 2:
        raise CapstackError(f"{where(out, 'alphas')} expected [T, L], got shape {alphas.shape}")
    if alphas.shape[0] < n_words:
        raise CapstackError(
            f"{where(out, 'alphas')} has {alphas.shape[0]} rows (shape {alphas.shape}) "
            f"but the caption has {n_words} words"
        )
    return np.clip(np.nan_to_num(alphas[:n_words]), 0.0, None)


def _check_locations(
    alphas: np.ndarray, grid: int | None, boxes: np.ndarray | None, out: Path
) -> np.ndarray | None:
    """Check that alphas' L matches the grid or boxes; return boxes as ``[N, 4]`` floats."""
    if (grid is None) == (boxes is None):
        raise CapstackError(f"{where(out)}: give exactly one of grid= or boxes=")
    n_locations = alphas.shape[1]
    if grid is not None:
        if grid < 1 or n_locations != grid * grid:
            raise CapstackError(
                f"{where(out, 'alphas')} shape {alphas.shape} does not match a "
                f"{grid}x{grid} grid (expected L = {grid * grid})"
            )
        return None
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise CapstackError(f"{where(out, 'boxes')} expected [N, 4], got shape {boxes.shape}")
    if n_locations < boxes.shape[0]:
        raise CapstackError(
            f"{where(out, 'alphas')} shape {alphas.shape} has fewer locations than "
            f"boxes {boxes.shape}"
        )
    return boxes


def weight_scale(rows: list[np.ndarray], locations: int) -> Normalize:
    """The colour scale of one figure: 0 to its largest weight, and to at least
    ``EVEN_SPREAD_LEVEL`` times the weight of attention spread evenly over its ``locations``
    cells or regions (an even spread is then a quarter of the way up)."""
    peak = max((float(row.max()) for row in rows if row.size), default=0.0)
    return Normalize(0.0, max(peak, EVEN_SPREAD_LEVEL / max(locations, 1)), clip=True)


def _panel_figure(n_panels: int, height: int, width: int) -> tuple[Figure, list[Axes]]:
    """A figure with ``n_panels`` image axes wrapped into rows of at most five."""
    cols = min(PANELS_PER_ROW, n_panels)
    rows = math.ceil(n_panels / PANELS_PER_ROW)
    panel_height = PANEL_WIDTH_IN * height / width + TITLE_HEIGHT_IN
    fig = Figure(figsize=(cols * PANEL_WIDTH_IN + COLOUR_BAR_IN, rows * panel_height),
                 layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    for ax in axes:
        ax.set_axis_off()
    return fig, axes


def _colour_bar(fig: Figure, axes: list[Axes], scale: Normalize, regions: bool) -> None:
    what = "weight of a region" if regions else "weight of a grid cell"
    bar = fig.colorbar(ScalarMappable(norm=scale, cmap=CMAP), ax=axes, shrink=0.8,
                       fraction=0.04, pad=0.02)
    bar.set_label(f"attention: {what}", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def _draw_grid_panel(ax: Axes, image: np.ndarray, alpha_row: np.ndarray, grid: int,
                     scale: Normalize) -> None:
    """The image under the word's heat map: colour and opacity both grow with the weight. The
    smoothed map (resample.py) is scaled to peak at the word's strongest cell's weight: the
    blur lowers a lone cell's peak, and the colour bar reads the weights of cells."""
    height, width = image.shape[:2]
    heat = upsampled_attention(alpha_row, grid, height, width)
    peak = float(heat.max())
    if peak > 0:
        heat *= float(alpha_row.max()) / peak
    level = np.asarray(scale(heat))
    colours = CMAP(level)
    colours[..., 3] = HEAT_OPACITY * level
    ax.imshow(image)
    ax.imshow(colours, interpolation="bilinear")


def drawn_boxes(alpha_row: np.ndarray, n_boxes: int) -> list[int]:
    """The regions a panel outlines, lightest first (the heaviest drawn on top): the word's
    heaviest ``BOXES_DRAWN``, each of at least ``BOX_SHARE_DRAWN`` of its attention; the
    heaviest always."""
    weights = alpha_row[:n_boxes]
    if weights.size == 0:
        return []
    order = np.argsort(weights)[::-1][:BOXES_DRAWN]
    kept = [int(i) for k, i in enumerate(order) if k == 0 or weights[i] >= BOX_SHARE_DRAWN]
    return kept[::-1]


def _draw_box_panel(ax: Axes, image: np.ndarray, alpha_row: np.ndarray, boxes: np.ndarray,
                    scale: Normalize) -> None:
    """The image with the word's heaviest regions outlined: the heavier a region, the thicker
    and brighter its outline (a dark edge keeps a bright outline readable on light images)."""
    ax.imshow(image)
    thin, thick = BOX_LINE_WIDTH
    for i in drawn_boxes(alpha_row, len(boxes)):
        level = float(scale(alpha_row[i]))
        width = thin + (thick - thin) * level
        x1, y1, x2, y2 = boxes[i]
        box = Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=CMAP(level),
                        linewidth=width)
        box.set_path_effects([withStroke(linewidth=width + 1.5, foreground="black", alpha=0.6)])
        ax.add_patch(box)
    ax.set_xlim(-0.5, image.shape[1] - 0.5)  # a box past the border does not widen the panel
    ax.set_ylim(image.shape[0] - 0.5, -0.5)


def _panel_title(word: str, alpha_row: np.ndarray, n_locations: int) -> str:
    """The word and the weight of its strongest cell or region: ``red 0.42``."""
    weights = alpha_row[:n_locations]
    return f"{word} {float(weights.max()) if weights.size else 0.0:.2f}"


def _draw_panel(ax: Axes, image: np.ndarray, word: str, row: np.ndarray, grid: int | None,
                boxes: np.ndarray | None, scale: Normalize, fontsize: float) -> None:
    if boxes is None:
        assert grid is not None, "_check_locations: exactly one of grid and boxes"
        _draw_grid_panel(ax, image, row, grid, scale)
    else:
        _draw_box_panel(ax, image, row, boxes, scale)
    ax.set_title(_panel_title(word, row, len(row) if boxes is None else len(boxes)),
                 fontsize=fontsize)


def attention_drawing(
    image: np.ndarray | str | os.PathLike,
    words: list[str],
    alphas: np.ndarray,
    out: Path,
    *,
    grid: int | None = None,
    boxes: np.ndarray | None = None,
    title: str | None = None,
) -> Figure:
    """The figure :func:`attention_figure` saves to ``out`` (named in its errors)."""
    out = Path(out)
    image = _check_image(image, out)
    alphas = _check_alphas(alphas, len(words), out)
    boxes = _check_locations(alphas, grid, boxes, out)
    locations = alphas.shape[1] if boxes is None else len(boxes)
    scale = weight_scale([row[:locations] for row in alphas], locations)
    fig, axes = _panel_figure(1 + len(words), *image.shape[:2])
    axes[0].imshow(image)
    for ax, word, row in zip(axes[1:], words, alphas):
        _draw_panel(ax, image, word, row, grid, boxes, scale, fontsize=10)
    _colour_bar(fig, axes, scale, regions=boxes is not None)
    if title:
        fig.suptitle(title)
    return fig


def attention_figure(
    image: np.ndarray | str | os.PathLike,
    words: list[str],
    alphas: np.ndarray,
    out: Path,
    *,
    grid: int | None = None,
    boxes: np.ndarray | None = None,
    title: str | None = None,
) -> Path:
    """Draw the image followed by one attention panel per caption word, and the figure's colour
    bar; save PNG to ``out``.

    ``image`` is an H x W x 3 uint8 array, or the image file's path: then it is loaded as the
    extractor loaded it (:func:`figure_image`).

    ``alphas`` is ``[T, L]``; rows past ``len(words)`` are ignored. Give
    ``grid=k`` for a ``k x k`` spatial grid (heat map over the image) or ``boxes`` as
    ``[N, 4]`` x1,y1,x2,y2 pixels for region features (outlines of the heaviest regions;
    columns past ``N`` are padding and ignored). Each panel's title is its word and the weight
    of its strongest cell or region.
    """
    return save_png(attention_drawing(image, words, alphas, out, grid=grid, boxes=boxes,
                                      title=title), Path(out))


def stages_figure(
    image: np.ndarray | str | os.PathLike,
    stages: list[tuple[str, list[str], np.ndarray | None]],
    out: Path,
    *,
    grid: int | None = None,
    boxes: np.ndarray | None = None,
) -> Path:
    """Stack-Cap's Figure 3: one row per stage, its caption and its attention per word, on one
    colour scale (one colour bar).

    ``stages`` holds (label, words, alphas [T, L] or None) from coarse to fine;
    a stage without attention (the coarse LSTM) shows its caption on the image. ``image`` is
    an array or a path, as for :func:`attention_figure`.
    """
    out = Path(out)
    image = _check_image(image, out)
    checked = [(label, words, None if alphas is None else _check_alphas(alphas, len(words), out))
               for label, words, alphas in stages]
    stage_boxes = {label: _check_locations(alphas, grid, boxes, out)
                   for label, _, alphas in checked if alphas is not None}
    locations = len(boxes) if boxes is not None else (grid or 1) ** 2
    scale = weight_scale([row[:locations] for _, _, alphas in checked if alphas is not None
                          for row in alphas], locations)
    cols = 1 + max(len(words) for _, words, _ in checked)
    height, width = image.shape[:2]
    panel_height = PANEL_WIDTH_IN * height / width + TITLE_HEIGHT_IN
    fig = Figure(figsize=(cols * PANEL_WIDTH_IN * 0.8 + COLOUR_BAR_IN,
                          len(checked) * panel_height * 0.8), layout="constrained")
    panels = []
    for r, (label, words, alphas) in enumerate(checked):
        first = fig.add_subplot(len(checked), cols, r * cols + 1)
        first.imshow(image)
        first.set_axis_off()
        first.set_title(f"{label}: {' '.join(words)}", loc="left", fontsize=8)
        panels.append(first)
        if alphas is None:
            continue
        for k, (word, row) in enumerate(zip(words, alphas)):
            ax = fig.add_subplot(len(checked), cols, r * cols + 2 + k)
            ax.set_axis_off()
            _draw_panel(ax, image, word, row, grid, stage_boxes[label], scale, fontsize=8)
            panels.append(ax)
    if stage_boxes:
        _colour_bar(fig, panels, scale, regions=boxes is not None)
    return save_png(fig, out)
