"""Attention weights of a grid spread over an image's pixels: upsampling and smoothing as matrices.

Writing the upsampling and the Gaussian blur as matrices keeps the 2-D map
separable and dependency free: ``rows @ cells @ cols.T``.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.core.errors import CapstackError


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
