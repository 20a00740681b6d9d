"""``capstack report --compare A B``: is evaluation A's difference from B real on these images?

Each evaluation folder holds ``metrics.json`` and ``image_statistics.json`` (evaluate writes
both). The two must have scored the same images; every metric value both have per-image
statistics of (BLEU-1..4, ROUGE-L, CIDEr) is compared by the paired bootstrap
(trainer/scoring/bootstrap.py): A's value, B's, A - B, its interval, and the share of
resamples in which A is ahead, in percent as the report's table shows values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError, where
from pipeline.core.jsonfile import read_json, write_json
from trainer.evaluation.report import read_metrics_doc, training_of
from trainer.scoring.bootstrap import CONFIDENCE, RESAMPLES, Difference, paired_bootstrap
from trainer.scoring.metrics import METRICS, STATISTICS_FILE, metrics


@dataclass
class Evaluation:
    """One evaluation folder: what it is called, and its images' statistics per metric."""

    folder: Path
    label: str  # approach (training)
    image_ids: list[int]
    statistics: dict[str, np.ndarray]  # metric name -> [images, k]


def read_evaluation(path: str | Path) -> Evaluation:
    """An evaluation folder (or its metrics.json), with its image statistics, checked."""
    folder = Path(path)
    folder = folder.parent if folder.name == "metrics.json" else folder
    doc = read_metrics_doc(folder / "metrics.json")
    stats_path = folder / STATISTICS_FILE
    if not stats_path.is_file():
        raise CapstackError(f"{stats_path}: not found: evaluate again (`capstack evaluate`) to "
                            f"write each image's statistics, which the comparison resamples")
    data = read_json(stats_path, "image statistics")
    ids = data.get("image_ids") if isinstance(data, dict) else None
    per_metric = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids) \
            or not isinstance(per_metric, dict):
        raise CapstackError(f"{where(stats_path)}: expected image_ids (a list of integers) and "
                            f"metrics (per-image rows by metric)")
    statistics = {}
    for name, rows in per_metric.items():
        array = np.asarray(rows, dtype=np.float64)
        if array.ndim != 2 or len(array) != len(ids) or not np.isfinite(array).all():
            raise CapstackError(f"{where(stats_path, f'metrics.{name}')}: expected one row "
                                f"of finite numbers per image ({len(ids)} images)")
        statistics[name] = array
    training, _ = training_of(doc)
    label = f"{doc['approach']} ({training})" if training else doc["approach"]
    return Evaluation(folder, label, ids, statistics)


def aligned(a: Evaluation, b: Evaluation, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Both evaluations' statistics of metric ``name``, B's rows in A's image order."""
    row_of = {image_id: row for row, image_id in enumerate(b.image_ids)}
    return a.statistics[name], b.statistics[name][[row_of[i] for i in a.image_ids]]


def compare(a: Evaluation, b: Evaluation, *, resamples: int = RESAMPLES, seed: int = 0,
            confidence: float = CONFIDENCE) -> list[Difference]:
    """The paired bootstrap of every value both have statistics of, in the table's order."""
    if set(a.image_ids) != set(b.image_ids) or len(a.image_ids) != len(b.image_ids):
        only_a = sorted(set(a.image_ids) - set(b.image_ids))[:3]
        only_b = sorted(set(b.image_ids) - set(a.image_ids))[:3]
        raise CapstackError(f"{a.folder} and {b.folder}: not the same images (only in the "
                            f"first: {only_a}, only in the second: {only_b}); compare "
                            f"evaluations of one split")
    shared = [name for name, _ in metrics() if name in a.statistics and name in b.statistics]
    if not shared:
        raise CapstackError(f"{a.folder} and {b.folder}: no metric with per-image statistics "
                            f"in both")
    return [d for name in shared for d in paired_bootstrap(
        METRICS.get(name)(), *aligned(a, b, name), resamples=resamples, seed=seed,
        confidence=confidence)]


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
