"""Figures for papers and sanity checks: attention maps and training curves.

Everything draws on :class:`matplotlib.figure.Figure` objects with the Agg
renderer, never through pyplot, so nothing here opens a window or touches
pyplot's global figure registry (figures are freed when they go out of scope).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pipeline.core.errors import CapstackError, where  # noqa: E402

PANELS_PER_ROW = 5
PANEL_WIDTH_IN = 2.4
TITLE_HEIGHT_IN = 0.35
DPI = 100
MOVING_AVERAGE_WINDOW = 20


# --------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------


def _save_png(fig: Figure, out: Path) -> Path:
    """Write ``fig`` to ``out`` as PNG so that ``out`` appears whole or not at all."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        dir=out.parent, prefix=f".{out.stem}.", suffix=out.suffix or ".png"
    )
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


# --------------------------------------------------------------------------
# Attention maps: pure numpy helpers
# --------------------------------------------------------------------------


def _bilinear_matrix(size: int, cells: int) -> np.ndarray:
    """``[size, cells]`` matrix that upsamples ``cells`` values to ``size`` pixels.

    Pixel centres are aligned with cell centres (``align_corners=False``, as in
    PIL and torch), so a one-hot cell peaks at the centre of its own region.
    """
    src = (np.arange(size) + 0.5) * cells / size - 0.5
    src = np.clip(src, 0.0, cells - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, cells - 1)
    frac = src - lo
    mat = np.zeros((size, cells))
    rows = np.arange(size)
    np.add.at(mat, (rows, lo), 1.0 - frac)
    np.add.at(mat, (rows, hi), frac)
    return mat


def _nearest_matrix(size: int, cells: int) -> np.ndarray:
    """``[size, cells]`` 0/1 matrix giving each pixel the value of the cell it lies in."""
    mat = np.zeros((size, cells))
    mat[np.arange(size), (np.arange(size) * cells) // size] = 1.0
    return mat


def _reflect(index: np.ndarray, size: int) -> np.ndarray:
    """Mirror indices into ``[0, size)`` (edge pixel repeated, like scipy's 'reflect')."""
    index = np.mod(index, 2 * size)
    return np.where(index >= size, 2 * size - 1 - index, index)


def _gaussian_matrix(size: int, sigma: float) -> np.ndarray:
    """``[size, size]`` matrix applying a 1-D Gaussian blur with mirrored edges.

    Writing the blur as a matrix keeps the 2-D blur separable and dependency
    free: ``G_rows @ image @ G_cols.T``.
    """
    if sigma <= 0:
        return np.eye(size)
    radius = max(1, int(math.ceil(3 * sigma)))
    offsets = np.arange(-radius, radius + 1)
    weights = np.exp(-0.5 * (offsets / sigma) ** 2)
    weights /= weights.sum()
    rows = np.repeat(np.arange(size), offsets.size)
    cols = _reflect(rows + np.tile(offsets, size), size)
    mat = np.zeros((size, size))
    np.add.at(mat, (rows, cols), np.tile(weights, size))
    return mat


def upsampled_attention(
    alpha_row: np.ndarray, grid: int, height: int, width: int, smooth: bool = True
) -> np.ndarray:
    """Spread one word's ``grid*grid`` attention weights over an ``height x width`` image.

    Cells are row-major (cell ``(r, c)`` is ``alpha_row[r * grid + c]``). With
    ``smooth`` the map is bilinearly upsampled and then Gaussian-blurred with a
    sigma of half a cell, as in Show, Attend and Tell's figures; without it
    every pixel simply takes its cell's weight (piecewise constant).
    """
    alpha = np.asarray(alpha_row, dtype=np.float64).reshape(-1)
    if grid < 1 or alpha.size != grid * grid:
        raise CapstackError(
            f"attention row has {alpha.size} weights, expected grid*grid = {grid}*{grid}"
        )
    if height < 1 or width < 1:
        raise CapstackError(f"attention map size must be positive, got {height}x{width}")
    cells = alpha.reshape(grid, grid)
    if not smooth:
        return _nearest_matrix(height, grid) @ cells @ _nearest_matrix(width, grid).T
    rows = _gaussian_matrix(height, height / grid / 2) @ _bilinear_matrix(height, grid)
    cols = _gaussian_matrix(width, width / grid / 2) @ _bilinear_matrix(width, grid)
    return rows @ cells @ cols.T


# --------------------------------------------------------------------------
# Attention maps: validation and drawing
# --------------------------------------------------------------------------


def _check_image(image: np.ndarray, out: Path) -> np.ndarray:
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
    image: np.ndarray,
    words: list[str],
    alphas: np.ndarray,
    out: Path,
    *,
    grid: int | None = None,
    boxes: np.ndarray | None = None,
    title: str | None = None,
) -> Path:
    """Draw the image followed by one attention panel per caption word; save PNG to ``out``.

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
            _draw_grid_panel(ax, image, row, grid)
        else:
            _draw_box_panel(ax, image, row, boxes)
        ax.set_title(word)
    if title:
        fig.suptitle(title)
    return _save_png(fig, out)


def stages_figure(
    image: np.ndarray,
    stages: list[tuple[str, list[str], np.ndarray | None]],
    out: Path,
    *,
    grid: int | None = None,
    boxes: np.ndarray | None = None,
) -> Path:
    """Stack-Cap's Figure 3: one row per stage, its caption and its attention per word.

    ``stages`` holds (label, words, alphas [T, L] or None) from coarse to fine;
    a stage without attention (the coarse LSTM) shows its caption on the image.
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
                _draw_grid_panel(ax, image, row, grid)
            else:
                _draw_box_panel(ax, image, row, stage_boxes)
            ax.set_title(word, fontsize=8)
    return _save_png(fig, out)


# --------------------------------------------------------------------------
# Training curves
# --------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_metrics(path: Path) -> list[dict]:
    """Parse the JSON-lines log, naming the file and line of anything malformed."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CapstackError(f"{path}: metrics file not found") from None
    except OSError as e:
        raise CapstackError(f"{path}: cannot read metrics file ({e.strerror})") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CapstackError(f"{path}: line {number}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise CapstackError(f"{path}: line {number}: expected a JSON object")
        _check_record(record, path, number)
        records.append(record)
    return records


def _check_record(record: dict, path: Path, number: int) -> None:
    kind = record.get("kind")
    required = {"train": ("epoch", "step", "loss"), "val": ("epoch", "cider")}.get(kind, ())
    if kind is None:
        raise CapstackError(f"{path}: line {number}: missing 'kind'")
    for key in required:
        if not _is_number(record.get(key)):
            raise CapstackError(f"{path}: line {number}: {kind} line needs a numeric {key!r}")


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` points (fewer at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def _plot_train(ax: Axes, train: list[dict], color: str = "tab:blue", label: str = "loss") -> None:
    train = sorted(train, key=lambda r: r["step"])
    steps = np.array([r["step"] for r in train], dtype=np.float64)
    losses = np.array([r["loss"] for r in train], dtype=np.float64)
    ax.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8, label=label)
    window = min(MOVING_AVERAGE_WINDOW, losses.size)
    ax.plot(steps, _moving_average(losses, window), color=color, linewidth=1.6,
            label=f"moving average ({window})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss" if label == "loss" else label, color=color)
    ax.legend(loc="upper right" if label == "loss" else "center right")


def _plot_val(ax: Axes, val: list[dict], color: str = "tab:orange", label: str | None = None
              ) -> None:
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation CIDEr")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not val:
        ax.text(0.5, 0.5, "no validation yet", ha="center", va="center", transform=ax.transAxes)
        return
    val = sorted(val, key=lambda r: r["epoch"])
    ax.plot([r["epoch"] for r in val], [r["cider"] for r in val], "o-", color=color, label=label)


def training_curves(metrics_jsonl: Path, out: Path, before: Path | None = None) -> Path:
    """Plot training loss by step and validation CIDEr by epoch from a metrics log.

    ``before``: the log of the run this one started from (XE before RL); both
    phases are drawn on one time axis, the RL loss on its own scale (right).
    """
    metrics_jsonl = Path(metrics_jsonl)
    train, val = _phase(metrics_jsonl)
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, cider_ax = fig.subplots(1, 2)
    if before is None:
        _plot_train(loss_ax, train)
        _plot_val(cider_ax, val)
        return _save_png(fig, Path(out))
    xe, rl = on_one_axis(_phase(Path(before)), (train, val))
    _plot_train(loss_ax, xe[0])
    _plot_train(loss_ax.twinx(), rl[0], color="tab:green", label="RL loss")
    loss_ax.axvline(rl[0][0]["step"] - 1, color="gray", linestyle="--", linewidth=1)
    _plot_val(cider_ax, xe[1], label="XE")
    _plot_val(cider_ax, rl[1], color="tab:green", label="RL")
    if rl[1]:
        cider_ax.axvline(rl[1][0]["epoch"], color="gray", linestyle="--", linewidth=1)
    cider_ax.legend(loc="lower right")
    return _save_png(fig, Path(out))


def on_one_axis(first: tuple[list, list], then: tuple[list, list]):
    """(train, val) lines of two phases, the second's steps and epochs shifted past the first's.

    The RL run logs its starting point as epoch -1 (the XE checkpoint it started
    from); shifted, it sits on the last XE epoch, so the RL curve starts there.
    """
    steps = max(r["step"] for r in first[0])
    epochs = 1 + max((r["epoch"] for r in first[1]), default=-1)
    train = [{**r, "step": r["step"] + steps} for r in then[0]]
    val = [{**r, "epoch": r["epoch"] + epochs} for r in sorted(then[1], key=lambda r: r["epoch"])]
    return first, (train, val)


def _phase(metrics_jsonl: Path) -> tuple[list[dict], list[dict]]:
    records = _read_metrics(metrics_jsonl)
    train = [r for r in records if r["kind"] == "train"]
    if not train:
        raise CapstackError(f"{metrics_jsonl}: no training lines (kind 'train') to plot")
    return train, [r for r in records if r["kind"] == "val"]
