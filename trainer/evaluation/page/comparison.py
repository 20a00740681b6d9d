"""The comparison page (``capstack report --compare A B --out DIR``: DIR/index.html).

At the top, the comparison's table with its intervals (an interval that excludes 0 in bold);
then every image where A's and B's captions differ, ranked by A - B of a per-image value (CIDEr
first), with its thumbnail, both captions with the differing words marked, the references, the
per-image scores and the attention pictures the evaluations drew.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pipeline.core.errors import CapstackError
from trainer.evaluation.evaluations import Evaluation
from trainer.evaluation.figures.qualitative import Example
from trainer.evaluation.page.files import copied, thumbnail
from trainer.evaluation.page.render import (INDEX, View, esc, html_table, notes_html,
                                            page_html, row_data, write_page)
from trainer.evaluation.page.rows import Row, compared_rows, default_value, ranked, value_order
from trainer.evaluation.page.sources import Known, known
from trainer.scoring.bootstrap import Difference

SIDES = ("a", "b")


@dataclass
class Compared:
    """Two systems' rows, over one pair of evaluations or one per seed."""

    labels: list[str]  # A's and B's
    values: list[str]  # the per-image values both have, in the table's order
    rows: list[Row]  # the images whose captions differ, ranked by :attr:`value`
    same: int  # images whose captions are the same in both
    images: int  # all the images compared
    first: tuple[Known, Known]  # what the first pair knows (the captions --images draws)
    notes: list[str] = field(default_factory=list)  # what the rows lack, and why, once each

    @property
    def value(self) -> str:
        return default_value(self.values)


def compared(pairs: Sequence[tuple[Evaluation, Evaluation]]) -> Compared:
    """The rows of every pair (seed with seed over seeds), ranked by CIDEr's A - B."""
    over_seeds = len(pairs) > 1
    rows: list[Row] = []
    same = images = 0
    notes: dict[str, None] = {}
    found = [(known(a.folder), known(b.folder)) for a, b in pairs]
    for (a, b), (found_a, found_b) in zip(pairs, found):
        lacking = [k.missing["captions"] for k in (found_a, found_b) if "captions" in k.missing]
        notes.update(dict.fromkeys(f"No rows: {why}" for why in lacking))
        more, alike = compared_rows(a, b, found_a, found_b,
                                    pair=a.seed if over_seeds else "") if not lacking else ([], 0)
        rows += more
        same, images = same + alike, images + (len(a.image_ids) if not lacking else 0)
        notes.update(dict.fromkeys(_lacking(more, found_a, found_b)))
    values = value_order([e for pair in pairs for e in pair])
    result = Compared([pairs[0][0].label, pairs[0][1].label], values, rows, same, images,
                      found[0], list(notes))
    result.rows = ranked(rows, result.value)
    return result


def figure_examples(result: Compared, count: int, images: Sequence[int] = ()) -> list[Example]:
    """The figure's images: the first ``count`` as the page ranks them, or ``images`` (ids of
    the first pair's images; any of them, their captions alike or not)."""
    if not images:
        return [Example(r.image_id, r.image, (r.sides[0].first, r.sides[1].first))
                for r in result.rows[:count]]
    a, b = result.first
    unknown = [i for i in images if i not in a.captions or i not in b.captions]
    if unknown:
        some = ", ".join(map(str, sorted(set(a.captions) & set(b.captions))[:5]))
        raise CapstackError(f"--images: {', '.join(map(str, unknown))}: not captioned by both "
                            f"{a.folder} and {b.folder} (their images: {some}, ...)")
    return [Example(i, a.images.get(i) or b.images.get(i),
                    (a.captions[i][0], b.captions[i][0])) for i in images]


def _lacking(rows: Sequence[Row], a: Known, b: Known) -> list[str]:
    """Why rows have no thumbnail or no references, said once."""
    lines = []
    if rows and not any(r.image for r in rows):
        why = "; ".join(dict.fromkeys(k.missing["images"] for k in (a, b)
                                      if "images" in k.missing))
        lines.append(f"No thumbnails: neither evaluation says where its images are ({why}).")
    if rows and not any(r.references for r in rows):
        why = "; ".join(dict.fromkeys(k.missing["references"] for k in (a, b)
                                      if "references" in k.missing))
        lines.append(f"No references: {why}.")
    return lines


def comparison_views(result: Compared, out_dir: Path) -> View:
    """The comparison's rows as the page's one view, their pictures written beside it."""
    view = View("A against B", result.labels, result.values, result.value)
    unreadable: dict[str, None] = {}
    for row in result.rows:
        thumb = None
        if row.image is not None:
            thumb, why = thumbnail(row.image, out_dir)
            if why:
                unreadable[why] = None
        pair = f"-s{row.pair}" if row.pair else ""
        attention = [copied(s.attention, out_dir, f"attention/{side}{pair}/{row.image_id}.png")
                     if s.attention else None for side, s in zip(SIDES, row.sides)]
        view.rows.append(row_data(row, result.values, thumb, attention))
    if unreadable:
        shown = list(unreadable)
        result.notes.append(f"{len(shown)} images without a thumbnail: {shown[0]}" +
                            (f" (and {len(shown) - 1} more)" if len(shown) > 1 else ""))
    view.note = (f"{len(result.rows)} of {result.images} images have other captions in A and "
                 f"B; the {result.same} where both read the same are not listed."
                 if result.images else "")
    return view


def differences_table(differences: Sequence[Difference]) -> str:
    """The comparison's table as compare.md shows it, intervals that exclude 0 in bold."""
    first = differences[0]
    columns = ["value", "A", "B", "A - B", f"{100 * first.confidence:g}% interval",
               "A ahead in"]
    rows = [[d.value, f"{100 * d.a:.1f}", f"{100 * d.b:.1f}", f"{100 * d.difference:+.1f}",
             f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}]", f"{100 * d.share:.1f}%"]
            for d in differences]
    real = [[False, False, False, d.low > 0 or d.high < 0, d.low > 0 or d.high < 0, False]
            for d in differences]
    return html_table(columns, rows, real)


def write_comparison_page(result: Compared, differences: Sequence[Difference],
                          described: Sequence[str], method: str, out_dir: Path,
                          name: str = INDEX) -> Path:
    """``out_dir/name``: the table (``described``: the lines naming A and B; ``method``: how
    it was computed), then the rows of ``result``."""
    view = comparison_views(result, out_dir)
    top = ('<div class="sides">' + "".join(f"<div>{esc(line)}</div>" for line in described) +
           "</div>" + differences_table(differences) + f'<p class="note">{esc(method)} An '
           f"interval in bold excludes 0.</p>" + notes_html(result.notes))
    title = f"{result.labels[0]} against {result.labels[1]}"
    return write_page(out_dir, page_html(title, top, "Where the captions differ", [view]), name)
