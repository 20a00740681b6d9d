"""``capstack report --compare A B``: is evaluation A's difference from B real on these images?

Each evaluation folder holds ``metrics.json`` and ``image_statistics.json`` (evaluate writes
both). The two must have scored the same images; every metric value both have per-image
statistics of (BLEU-1..4, ROUGE-L, CIDEr) is compared by the paired bootstrap
(trainer/scoring/bootstrap.py): A's value, B's, A - B, its interval, and the share of
resamples in which A is ahead, in percent as the report's table shows values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from trainer.evaluation.evaluations import Evaluation, aligned, read_evaluation
from trainer.scoring.bootstrap import CONFIDENCE, RESAMPLES, Difference, paired_bootstrap
from trainer.scoring.metrics import METRICS, metrics


def other_images(a: Evaluation, b: Evaluation) -> str:
    """Why two evaluations are not of the same images, naming a few of those only one has;
    "" when they are."""
    if set(a.image_ids) == set(b.image_ids) and len(a.image_ids) == len(b.image_ids):
        return ""
    only_a = sorted(set(a.image_ids) - set(b.image_ids))[:3]
    only_b = sorted(set(b.image_ids) - set(a.image_ids))[:3]
    return (f"{a.folder} and {b.folder}: not the same images (only in the first: {only_a}, "
            f"only in the second: {only_b})")


def compare_images(a: Evaluation, b: Evaluation) -> None:
    """Refuse two evaluations of other images (:func:`other_images`)."""
    why = other_images(a, b)
    if why:
        raise CapstackError(f"{why}; compare evaluations of one split")


def compare(a: Evaluation, b: Evaluation, *, resamples: int = RESAMPLES, seed: int = 0,
            confidence: float = CONFIDENCE) -> list[Difference]:
    """The paired bootstrap of every value both have statistics of, in the table's order."""
    return compare_over([(a, b)], resamples=resamples, seed=seed, confidence=confidence)


def compare_over(pairs: Sequence[tuple[Evaluation, Evaluation]], *, resamples: int = RESAMPLES,
                 seed: int = 0, confidence: float = CONFIDENCE,
                 only: str | None = None) -> list[Difference]:
    """The paired bootstrap over several pairs of evaluations (one pair per seed): each pair's
    images, all of them resampled together, for every value each pair has statistics of
    (``only``: of that metric alone)."""
    for a, b in pairs:
        compare_images(a, b)
    shared = [name for name, _ in metrics() if only in (None, name)
              and all(name in a.statistics and name in b.statistics for a, b in pairs)]
    if not shared:
        a, b = pairs[0]
        raise CapstackError(f"{a.folder} and {b.folder}: no metric with per-image statistics "
                            f"in both")
    differences = []
    for name in shared:
        a_rows, b_rows = zip(*(aligned(a, b, name) for a, b in pairs))
        differences += paired_bootstrap(METRICS.get(name)(), np.vstack(a_rows),
                                        np.vstack(b_rows), resamples=resamples, seed=seed,
                                        confidence=confidence)
    return differences


def paired(a: Sequence[Evaluation], b: Sequence[Evaluation]
           ) -> list[tuple[Evaluation, Evaluation]]:
    """Evaluations of A paired with B's: one each, or seed with seed (both over the same
    seeds, each seed once)."""
    if len(a) == 1 and len(b) == 1:
        return [(a[0], b[0])]
    for side, evaluations in (("A", a), ("B", b)):
        recipes = sorted({e.recipe for e in evaluations if e.recipe})
        if len(recipes) > 1:
            folders = ", ".join(str(e.folder) for e in evaluations)
            raise CapstackError(f"{side}'s evaluations ({folders}) are of {len(recipes)} "
                                f"recipes (setting.recipe), not one experiment over seeds: "
                                f"compare one recipe's runs")
    by_a, by_b = {e.seed: e for e in a}, {e.seed: e for e in b}
    if len(by_a) != len(a) or len(by_b) != len(b) or set(by_a) != set(by_b):
        unseeded = [e for e in (*a, *b) if not e.seed]
        why = (f"; {len(unseeded)} record no seed (metrics.json's setting.seed; an evaluation "
               f"of a results file records none): compare them one a side"
               if unseeded else "")
        raise CapstackError(f"A's seeds ({seeds_found(a)}) and B's ({seeds_found(b)}): "
                            f"compare runs over the same seeds, each once{why}")
    return [(by_a[s], by_b[s]) for s in sorted(by_a, key=lambda s: (len(s), s))]


def seeds_found(evaluations: Sequence[Evaluation]) -> str:
    """Each evaluation's seed as a message names it: ``0``, or ``none in FOLDER``."""
    return ", ".join(e.seed or f"none in {e.folder}" for e in evaluations)


def difference_over(pairs: Sequence[tuple[Evaluation, Evaluation]], value: str, *,
                    resamples: int = RESAMPLES, seed: int = 0) -> Difference | None:
    """``value``'s paired bootstrap of evaluations A against B over several pairs (one pair
    per seed): each pair's images, all of them resampled together; None when an evaluation
    has no per-image statistics of it."""
    name = next((n for n, metric in metrics() if value in metric.values), None)
    if name is None or not all(name in a.statistics and name in b.statistics
                               for a, b in pairs):
        return None
    found = compare_over(pairs, resamples=resamples, seed=seed, only=name)
    return next(d for d in found if d.value == value)


def _side(evaluations: Sequence[Evaluation]) -> str:
    first = evaluations[0]
    if len(evaluations) == 1:
        return f"{first.label}, {first.folder}"
    return (f"{first.label}, over seeds {', '.join(e.seed for e in evaluations)}: "
            f"{', '.join(str(e.folder) for e in evaluations)}")


def markdown(a: Sequence[Evaluation], b: Sequence[Evaluation],
             differences: list[Difference]) -> str:
    """The comparison as a table in percent, with what was compared and how."""
    first = differences[0]
    lines = [f"A: {_side(a)}", f"B: {_side(b)}", "",
             f"| value | A | B | A - B | {100 * first.confidence:g}% interval | A ahead in |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {d.value} | {100 * d.a:.1f} | {100 * d.b:.1f} | {100 * d.difference:+.1f} | "
              f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {100 * d.share:.1f}% |"
              for d in differences]
    lines += ["", _method(differences, len(a))]
    return "\n".join(lines) + "\n"


def _method(differences: Sequence[Difference], pairs: int) -> str:
    """How the comparison was computed, in a line."""
    first = differences[0]
    over = f" ({pairs} seeds' images together)" if pairs > 1 else ""
    return (f"Paired bootstrap over {first.images} images{over} (Koehn 2004): "
            f"{first.resamples} resamples with replacement, the same for A and B; a tie "
            f"counts half.")


class Written(NamedTuple):
    """What :func:`write_comparison` wrote: compare.json, compare.md (and its text), the page,
    and the figure's files (none without one)."""

    json: Path
    markdown: Path
    text: str
    page: Path | None
    figure: list[Path]


def write_comparison(a_paths: Sequence[str | Path], b_paths: Sequence[str | Path],
                     out_dir: str | Path, *, resamples: int = RESAMPLES, seed: int = 0,
                     confidence: float = CONFIDENCE, page: str | None = "index.html",
                     figure: int = 0, images: Sequence[int] = ()) -> Written:
    """Compare A's evaluations with B's (one each, or one per seed), write ``compare.json`` and
    ``compare.md`` in ``out_dir``, and the page ``out_dir/page`` (trainer/evaluation/page/:
    the table, then the images where the captions differ); with ``figure`` (K images, as the
    page ranks them) or ``images`` (those ids), ``figure.png`` and ``figure.pdf`` of both
    systems' captions under each image."""
    pairs = paired([read_evaluation(p) for p in a_paths], [read_evaluation(p) for p in b_paths])
    differences = compare_over(pairs, resamples=resamples, seed=seed, confidence=confidence)
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    text = markdown(a, b, differences)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "compare.json", out_dir / "compare.md"
    write_json(json_path, {"a": _written(a), "b": _written(b), "seed": seed,
                           "differences": [d.to_dict() for d in differences]})
    with atomic_file(md_path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    page_path, drawn = None, []
    if page or figure or images:
        from trainer.evaluation.page import compared, write_comparison_page

        result = compared(pairs)
        if page:
            lines = text.split("\n")
            page_path = write_comparison_page(result, differences, lines[:2],
                                              _method(differences, len(pairs)), out_dir, page)
        if figure or images:
            from trainer.evaluation.figures.qualitative import qualitative_figure
            from trainer.evaluation.page.comparison import figure_examples

            names = (result.labels[0], result.labels[1]) \
                if result.labels[0] != result.labels[1] else ("A", "B")
            drawn = qualitative_figure(figure_examples(result, figure, images), names,
                                       out_dir / "figure.png", out_dir / "figure.pdf")
    return Written(json_path, md_path, text, page_path, drawn)


def _written(evaluations: Sequence[Evaluation]) -> dict:
    """One side as compare.json holds it: its label and folder, and over seeds each seed's."""
    side: dict[str, Any] = {"label": evaluations[0].label,
                            "folder": str(evaluations[0].folder)}
    if len(evaluations) > 1:
        side |= {"folders": [str(e.folder) for e in evaluations],
                 "seeds": [e.seed for e in evaluations]}
    return side
