"""The report's page (``capstack report EVAL... --out DIR``: DIR/index.html): the table, block
by block with its notes; the training curves of each evaluated run (the ``curves.png`` its
evaluation drew); and a gallery of one evaluation's captions (``--gallery``, the first by
default): each image's thumbnail, its captions (every rank of an evaluation with ``--n``), the
references, its per-image scores and attention pictures, searchable and ranked by a value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from pipeline.core.errors import CapstackError
from trainer.evaluation.evaluations import Evaluation, read_evaluation
from trainer.evaluation.page.files import copied, thumbnail
from trainer.evaluation.page.render import (INDEX, View, esc, html_table, notes_html,
                                            page_html, row_data, write_page)
from trainer.evaluation.page.rows import default_value, gallery_rows, ranked, value_order
from trainer.evaluation.page.sources import known

LACKING = {"captions": "No captions", "references": "No references", "images": "No thumbnails"}


def table_html(blocks: Sequence[tuple[str, pd.DataFrame]]) -> str:
    """The report's table, one HTML table per block under its title."""
    parts = []
    for title, rows in blocks:
        cells = [[f"{v:.1f}" if isinstance(v, float) else str(v) for v in row]
                 for row in rows.itertuples(index=False)]
        heading = f"<h3>{esc(title)}</h3>" if len(blocks) > 1 else ""
        parts.append(heading + html_table(list(rows.columns), cells))
    return "".join(parts)


def curves_html(folders: Sequence[Path], names: Sequence[str], out_dir: Path) -> str:
    """Each evaluation's training curves (its curves.png, copied beside the page)."""
    figures = []
    for k, (folder, name) in enumerate(zip(folders, names)):
        curves = folder / "curves.png"
        if curves.is_file():
            src = copied(curves, out_dir, f"curves/{k + 1}-{folder.name}.png")
            figures.append(f'<figure><img loading="lazy" src="{esc(src)}" alt="training '
                           f'curves of {esc(name)}"><figcaption>{esc(name)} '
                           f"({esc(folder)})</figcaption></figure>")
    if not figures:
        return '<p class="note">No training curves: no evaluation holds a curves.png (an ' \
               "evaluation of a run with a training log draws one).</p>"
    return f'<div class="curves">{"".join(figures)}</div>'


def gallery_view(folder: Path, out_dir: Path) -> View:
    """One evaluation's images as the page's view: captions, references, scores, pictures."""
    found = known(folder)
    try:
        evaluation = read_evaluation(folder)
    except CapstackError as error:  # no per-image statistics: the captions without scores
        evaluation = Evaluation(folder, found.label, sorted(found.captions), {})
        note = f"No per-image scores: {error}"
    else:
        note = ""
    values = value_order([evaluation])
    view = View(f"{found.label}: {folder}", [found.label], values, default_value(values),
                note=note)
    rows = ranked(gallery_rows(evaluation, found), view.value) if values else \
        gallery_rows(evaluation, found)
    missing = [f"{LACKING[what]}: {why}" for what, why in found.missing.items()]
    unreadable = ""
    for row in rows:
        thumb = None
        if row.image is not None:
            thumb, why = thumbnail(row.image, out_dir)
            unreadable = unreadable or why
        side = row.sides[0]
        attention = [copied(side.attention, out_dir, f"attention/{folder.name}/"
                                                     f"{row.image_id}.png")
                     if side.attention else None]
        view.rows.append(row_data(row, values, thumb, attention))
    if unreadable:
        missing.append(f"Some images have no thumbnail: {unreadable}")
    view.note = ". ".join(part for part in [view.note, *missing] if part)
    return view


def write_report_page(blocks: Sequence[tuple[str, pd.DataFrame]], notes: Sequence[str],
                      folders: Sequence[Path], names: Sequence[str], gallery: Path,
                      out_dir: Path, name: str = INDEX) -> Path:
    """``out_dir/name``: the table (``blocks``, ``notes``), the curves of the evaluations in
    ``folders`` (named ``names``), and the gallery of evaluation ``gallery``."""
    view = gallery_view(gallery, out_dir)
    top = (table_html(blocks) + notes_html(notes) + "<h2>Training curves</h2>" +
           curves_html(folders, names, out_dir))
    title = "capstack report" if len(folders) != 1 else f"capstack report: {names[0]}"
    return write_page(out_dir, page_html(title, top, f"Captions of {view.sides[0]}", [view]),
                      name)
