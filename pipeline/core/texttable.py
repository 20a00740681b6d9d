"""Plain-text tables for the terminal: columns padded to their widest cell."""

from __future__ import annotations

from typing import Sequence


def text_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` (the header first) as lines, each column as wide as its widest cell."""
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
