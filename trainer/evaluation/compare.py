"""``capstack report --compare A B``: is evaluation A's difference from B real on these images?

Each evaluation folder holds ``metrics.json`` and ``image_statistics.json`` (evaluate writes
both). The two must have scored the same images; every metric value both have per-image
statistics of (BLEU-1..4, ROUGE-L, CIDEr) is compared by the paired bootstrap
(trainer/scoring/bootstrap.py): A's value, B's, A - B, its interval, and the share of
resamples in which A is ahead, in percent as the report's table shows values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from trainer.evaluation.evaluations import Evaluation, aligned, read_evaluation
from trainer.scoring.bootstrap import CONFIDENCE, RESAMPLES, Difference, paired_bootstrap
from trainer.scoring.metrics import METRICS, metrics


def compare_images(a: Evaluation, b: Evaluation) -> None:
    """Refuse two evaluations of other images, naming a few of those only one has."""
    if set(a.image_ids) != set(b.image_ids) or len(a.image_ids) != len(b.image_ids):
        only_a = sorted(set(a.image_ids) - set(b.image_ids))[:3]
        only_b = sorted(set(b.image_ids) - set(a.image_ids))[:3]
        raise CapstackError(f"{a.folder} and {b.folder}: not the same images (only in the "
                            f"first: {only_a}, only in the second: {only_b}); compare "
                            f"evaluations of one split")


def compare(a: Evaluation, b: Evaluation, *, resamples: int = RESAMPLES, seed: int = 0,
            confidence: float = CONFIDENCE) -> list[Difference]:
    """The paired bootstrap of every value both have statistics of, in the table's order."""
    compare_images(a, b)
    shared = [name for name, _ in metrics() if name in a.statistics and name in b.statistics]
    if not shared:
        raise CapstackError(f"{a.folder} and {b.folder}: no metric with per-image statistics "
                            f"in both")
    return [d for name in shared for d in paired_bootstrap(
        METRICS.get(name)(), *aligned(a, b, name), resamples=resamples, seed=seed,
        confidence=confidence)]


def difference_over(a_folders: list[str], b_folders: list[str], value: str, *,
                    resamples: int = RESAMPLES, seed: int = 0) -> Difference:
    """``value``'s paired bootstrap of evaluations A against B over several pairs of folders
    (one pair per seed, in order): each pair's images, all of them resampled together."""
    if len(a_folders) != len(b_folders):
        raise CapstackError(f"{a_folders} and {b_folders}: not one B evaluation per A one")
    name = next(n for n, m in metrics() if value in m.values)
    pairs = [(read_evaluation(a), read_evaluation(b)) for a, b in zip(a_folders, b_folders)]
    for a, b in pairs:
        compare_images(a, b)
    a_rows, b_rows = zip(*(aligned(a, b, name) for a, b in pairs))
    found = paired_bootstrap(METRICS.get(name)(), np.vstack(a_rows), np.vstack(b_rows),
                             resamples=resamples, seed=seed)
    return next(d for d in found if d.value == value)


def markdown(a: Evaluation, b: Evaluation, differences: list[Difference]) -> str:
    """The comparison as a table in percent, with what was compared and how."""
    first = differences[0]
    lines = [f"A: {a.label}, {a.folder}", f"B: {b.label}, {b.folder}", "",
             f"| value | A | B | A - B | {100 * first.confidence:g}% interval | A ahead in |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {d.value} | {100 * d.a:.1f} | {100 * d.b:.1f} | {100 * d.difference:+.1f} | "
              f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {100 * d.share:.1f}% |"
              for d in differences]
    lines += ["", f"Paired bootstrap over {first.images} images (Koehn 2004): {first.resamples} "
                  f"resamples with replacement, the same for A and B; a tie counts half."]
    return "\n".join(lines) + "\n"


def write_comparison(a_path: str | Path, b_path: str | Path, out_dir: str | Path, *,
                     resamples: int = RESAMPLES, seed: int = 0,
                     confidence: float = CONFIDENCE) -> tuple[Path, Path, str]:
    """Compare, write ``compare.json`` and ``compare.md`` in ``out_dir``; (their paths, the
    markdown)."""
    a, b = read_evaluation(a_path), read_evaluation(b_path)
    differences = compare(a, b, resamples=resamples, seed=seed, confidence=confidence)
    text = markdown(a, b, differences)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "compare.json", out_dir / "compare.md"
    write_json(json_path, {"a": {"label": a.label, "folder": str(a.folder)},
                           "b": {"label": b.label, "folder": str(b.folder)}, "seed": seed,
                           "differences": [d.to_dict() for d in differences]})
    with atomic_file(md_path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return json_path, md_path, text
