"""Attention maps: the image, then one panel per caption word (Show-Attend-Tell's figures), and
Stack-Cap's Figure 3 (a row per stage, coarse to fine).

Grid features draw as a smoothed heat map over the image (resample.py);
region features as their boxes, shaded by weight.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from pipeline.core.errors import CapstackError, where
from trainer.evaluation.figures.render import save_png
from trainer.evaluation.figures.resample import upsampled_attention

PANELS_PER_ROW = 5
PANEL_WIDTH_IN = 2.4
TITLE_HEIGHT_IN = 0.35


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
    return alphas[:n_words]


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


def _panel_figure(n_panels: int, height: int, width: int) -> tuple[Figure, list[Axes]]:
    """A figure with ``n_panels`` image axes wrapped into rows of at most five."""
    cols = min(PANELS_PER_ROW, n_panels)
    rows = math.ceil(n_panels / PANELS_PER_ROW)
    panel_height = PANEL_WIDTH_IN * height / width + TITLE_HEIGHT_IN
    fig = Figure(figsize=(cols * PANEL_WIDTH_IN, rows * panel_height), layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    for ax in axes:
        ax.set_axis_off()
    return fig, axes


def _draw_grid_panel(ax: Axes, image: np.ndarray, alpha_row: np.ndarray, grid: int) -> None:
    height, width = image.shape[:2]
    heat = upsampled_attention(alpha_row, grid, height, width)
    ax.imshow(image)
    ax.imshow(heat, cmap="jet", alpha=0.5, vmin=0.0, vmax=max(float(heat.max()), 1e-12))


def _draw_box_panel(ax: Axes, image: np.ndarray, alpha_row: np.ndarray, boxes: np.ndarray) -> None:
    """Shade each box by its weight relative to the word's strongest box; outline that one."""
    ax.imshow(image)
    weights = np.clip(np.nan_to_num(alpha_row[: len(boxes)]), 0.0, None)
    if weights.size == 0:
        return
    top = float(weights.max())
    for i in np.argsort(weights):
        x1, y1, x2, y2 = boxes[i]
        shade = 0.6 * float(weights[i]) / top if top > 0 else 0.0
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, facecolor="red",
                               edgecolor="none", alpha=shade))
    x1, y1, x2, y2 = boxes[int(np.argmax(weights))]
    ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False,
                           edgecolor="yellow", linewidth=2))


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
    """Draw the image followed by one attention panel per caption word; save PNG to ``out``.

    ``image`` is an H x W x 3 uint8 array, or the image file's path: then it is loaded as the
    extractor loaded it (:func:`figure_image`).

    ``alphas`` is ``[T, L]``; rows past ``len(words)`` are ignored. Give
    ``grid=k`` for a ``k x k`` spatial grid (heat-map overlay) or ``boxes`` as
    ``[N, 4]`` x1,y1,x2,y2 pixels for region features (shaded boxes; columns
    past ``N`` are padding and ignored).
    """
    out = Path(out)
    image = _check_image(image, out)
    alphas = _check_alphas(alphas, len(words), out)
    boxes = _check_locations(alphas, grid, boxes, out)
    fig, axes = _panel_figure(1 + len(words), *image.shape[:2])
    axes[0].imshow(image)
    for ax, word, row in zip(axes[1:], words, alphas):
        if boxes is None:
            assert grid is not None, "_check_locations: exactly one of grid and boxes"
            _draw_grid_panel(ax, image, row, grid)
        else:
            _draw_box_panel(ax, image, row, boxes)
        ax.set_title(word)
    if title:
        fig.suptitle(title)
    return save_png(fig, out)


def stages_figure(
    image: np.ndarray | str | os.PathLike,
    stages: list[tuple[str, list[str], np.ndarray | None]],
    out: Path,
    *,
    grid: int | None = None,
    boxes: np.ndarray | None = None,
) -> Path:
    """Stack-Cap's Figure 3: one row per stage, its caption and its attention per word.

    ``stages`` holds (label, words, alphas [T, L] or None) from coarse to fine;
    a stage without attention (the coarse LSTM) shows its caption on the image. ``image`` is
    an array or a path, as for :func:`attention_figure`.
    """
    out = Path(out)
    image = _check_image(image, out)
    cols = 1 + max(len(words) for _, words, _ in stages)
    height, width = image.shape[:2]
    panel_height = PANEL_WIDTH_IN * height / width + TITLE_HEIGHT_IN
    fig = Figure(figsize=(cols * PANEL_WIDTH_IN * 0.8, len(stages) * panel_height * 0.8),
                 layout="constrained")
    for r, (label, words, alphas) in enumerate(stages):
        first = fig.add_subplot(len(stages), cols, r * cols + 1)
        first.imshow(image)
        first.set_axis_off()
        first.set_title(f"{label}: {' '.join(words)}", loc="left", fontsize=8)
        if alphas is None:
            continue
        alphas = _check_alphas(alphas, len(words), out)
        stage_boxes = _check_locations(alphas, grid, boxes, out)
        for k, (word, row) in enumerate(zip(words, alphas)):
            ax = fig.add_subplot(len(stages), cols, r * cols + 2 + k)
            ax.set_axis_off()
            if stage_boxes is None:
                assert grid is not None, "_check_locations: exactly one of grid and boxes"
                _draw_grid_panel(ax, image, row, grid)
            else:
                _draw_box_panel(ax, image, row, stage_boxes)
            ax.set_title(word, fontsize=8)
    return save_png(fig, out)
