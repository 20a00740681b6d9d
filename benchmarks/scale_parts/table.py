"""benchmarks/scale.py's table: cost by size (time / peak RSS), the growth exponent between
consecutive sizes, notes per cost, and the same table in markdown."""

from __future__ import annotations

import math
import os

def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())



def seconds_text(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s" if s < 10 else f"{s:.0f} s"


def cell(figures: dict | None) -> str:
    if not figures:
        return "-"
    if "error" in figures:
        return "failed"
    return f"{seconds_text(figures['seconds'])} / {figures['peak_mb']:.0f} MB"


def describe(figures: dict) -> str:
    if "error" in figures:
        return figures["error"]
    mapped = figures.get("file_mb", 0)
    return f"{cell(figures)}: {figures.get('note', '')}" + (
        f" [RSS at its end: {figures['anon_mb']:.0f} MB anonymous, {mapped:.0f} MB mapped "
        f"from files: libraries, and store pages read through LMDB's map (page cache)]"
        if mapped > 100 else "")


def exponents(by_n: dict[int, dict], sizes: list[int]) -> str:
    """log(t2/t1)/log(N2/N1) between consecutive sizes that both have a time."""
    out = []
    for a, b in zip(sizes, sizes[1:]):
        fa, fb = by_n.get(a, {}), by_n.get(b, {})
        if "seconds" in fa and "seconds" in fb and fa["seconds"] > 0 and fb["seconds"] > 0:
            out.append(f"{math.log(fb['seconds'] / fa['seconds']) / math.log(b / a):.2f}")
    return " / ".join(out) or "-"


def size_label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else f"{n / 1000:.0f}k" if n >= 10_000 else str(n)


def table_rows(results: dict, sizes: list[int], once: set[str]) -> list[list[str]]:
    """``once``: the costs measured at the first size only (no exponent)."""
    header = ["cost", *(size_label(n) for n in sizes), "exponent"]
    rows = [header]
    for name, by_n in results.items():
        cols = sizes if name not in once else [n for n in sizes if n in by_n]
        rows.append([name, *(cell(by_n.get(n)) if n in cols else "" for n in sizes),
                     exponents(by_n, sizes) if name not in once else "-"])
    return rows


def print_tables(results: dict, sizes: list[int], once: set[str]) -> None:
    rows = table_rows(results, sizes, once)
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    print(f"\ntime / peak RSS per cost (load now {load()}; {os.cpu_count()} cores)")
    for k, row in enumerate(rows):
        print("  ".join(c.ljust(wd) for c, wd in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * wd for wd in widths))
    print("\nnotes:")
    for name, by_n in results.items():
        for n, figures in by_n.items():
            print(f"  {name} @ {size_label(n)}: {describe(figures)}")
    print("\n| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows[1:]:
        print("| " + " | ".join(row) + " |")
