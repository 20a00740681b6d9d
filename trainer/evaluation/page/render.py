"""index.html from its parts: page.html with page.css and page.js inlined, the tables above the
rows as HTML, and the rows as JSON in a ``<script type="application/json">`` element, which
page.js renders a page at a time. The page loads nothing from the network (its Content Security
Policy forbids it): what it shows is inline or a file beside it.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Sequence

from pipeline.core.atomic import atomic_file
from trainer.evaluation.page.rows import Row

HERE = Path(__file__).resolve().parent
INDEX = "index.html"


@dataclass
class View:
    """One list of rows the page can show: a comparison's (two sides) or one evaluation's
    gallery (one side), with the values it ranks by and the one it ranks by first."""

    name: str
    sides: list[str]  # each side's label: A's, B's (or the evaluation's)
    values: list[str]
    value: str
    rows: list[dict] = field(default_factory=list)  # :func:`row_data` of each row
    note: str = ""


def row_data(row: Row, values: Sequence[str], thumbnail: str | None,
             attention: Sequence[str | None]) -> dict[str, Any]:
    """A row as page.js reads it, in short keys (5,000 rows stay a few MB): ``id``, ``c``
    each side's captions, ``m`` each side's marked word places, ``v`` each value's scores
    (one per side, in ``values``' order), ``r`` the references, ``t`` the thumbnail, ``a``
    each side's attention picture, ``p`` the seed of its pair."""
    data: dict[str, Any] = {"id": row.image_id, "c": [s.captions for s in row.sides],
                            "v": [row.scores[v] for v in values], "r": row.references}
    if any(s.marked for s in row.sides):
        data["m"] = [s.marked for s in row.sides]
    if thumbnail:
        data["t"] = thumbnail
    if any(attention):
        data["a"] = list(attention)
    if row.pair:
        data["p"] = row.pair
    return data


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


# a figure, a difference with its interval, an interval, mean ± std, a percentage, n/a
NUMBER = re.compile(r"^[-+]?\d[\d.,]*%?( ± [\d.]+| \[[-+\d., ]+\])?$|^\[[-+\d., ]+\]$|^n/a$")


def html_table(columns: Sequence[str], rows: Sequence[Sequence[Any]],
               strong: Sequence[Sequence[bool]] = ()) -> str:
    """A table of text cells (escaped; numbers set right, as figures are); ``strong`` marks
    cells to set in bold."""
    def cell(k: int, j: int, text: Any) -> str:
        classes = ["num"] if NUMBER.match(str(text)) else []
        if k < len(strong) and j < len(strong[k]) and strong[k][j]:
            classes.append("real")
        return f'<td class="{" ".join(classes)}">{esc(text)}</td>' if classes else \
            f"<td>{esc(text)}</td>"

    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(k, j, text) for j, text in enumerate(row)) + "</tr>"
                   for k, row in enumerate(rows))
    return f'<table class="metrics"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def notes_html(notes: Sequence[str]) -> str:
    return f'<ul class="notes">{"".join(f"<li>{esc(n)}</li>" for n in notes)}</ul>' \
        if notes else ""


def page_html(title: str, top: str, rows_title: str, views: Sequence[View]) -> str:
    """The whole page: ``top`` (HTML) above the rows of ``views``."""
    data = json.dumps({"views": [vars(v) for v in views]}, separators=(",", ":"),
                      ensure_ascii=False)
    # inside <script>, "</script" or "<!--" would end or bend the element: no "<" at all
    data = data.replace("<", "\\u003c")
    template = Template((HERE / "page.html").read_text(encoding="utf-8"))
    return template.substitute(title=esc(title), top=top, rows_title=esc(rows_title),
                               css=(HERE / "page.css").read_text(encoding="utf-8"),
                               js=(HERE / "page.js").read_text(encoding="utf-8"), data=data)


def write_page(out_dir: Path, text: str, name: str = INDEX) -> Path:
    """``text`` as ``out_dir/name``, whole or not at all."""
    path = Path(out_dir) / name
    with atomic_file(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return path
