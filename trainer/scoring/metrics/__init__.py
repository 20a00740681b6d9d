"""Caption metrics, found by name: BLEU-1..4, METEOR, ROUGE-L, CIDEr, SPICE, the diversity figures.

Each module registers a :class:`~trainer.scoring.metrics.base.Metric` class with
``@METRICS.register(name)``; importing this package imports every module in it, so adding
a metric is one new file here: :func:`score` runs it, ``capstack report`` shows its
columns, and a value it gives a ``keys`` name can be a run's ``train.select_on``.

Two rules shape scoring:

* A run never dies over a metric. A metric that cannot run (no Java for METEOR, no
  CoreNLP jars for SPICE: :meth:`Metric.missing`) or that raises gives ``None`` plus a
  reason in ``"unavailable"``; a value is never made up.
* Nothing is downloaded at run time (spice.py).
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Collection, Hashable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pipeline.core.errors import CapstackError, where
from pipeline.core.registry import Registry, import_modules
from trainer.scoring.metrics.base import Metric, Texts
from trainer.scoring.references import (check_inputs, first_references, load_references,
                                        load_results)
from trainer.scoring.text import tokenize_any

METRICS = Registry("metric")
MAIN_SECTION = "metrics"  # metrics.json's part for the table's values
STATISTICS_FILE = "image_statistics.json"  # beside metrics.json: scored_images' second part


def metrics() -> list[tuple[str, Metric]]:
    """(name, an instance) of every registered metric, in the table's order."""
    made = [(name, cls()) for name, cls in METRICS.items()]
    return sorted(made, key=lambda item: (item[1].place, item[0]))


def value_names(section: str = MAIN_SECTION) -> tuple[str, ...]:
    """The names of the values filed under ``section`` of metrics.json, in the table's order
    (``metrics``: BLEU-1, ..., SPICE)."""
    return tuple(v for _, m in metrics() if m.section == section for v in m.values)


def table_columns() -> list[tuple[str, str]]:
    """(report's column header, the value it shows) of every metric the table shows."""
    return [(column, value) for _, m in metrics() for column, value in zip(m.columns, m.values)]


class Selectable(NamedTuple):
    """A value validation can score each epoch: its metric and its place among its values."""

    metric: Metric
    position: int  # in the metric's values

    @property
    def label(self) -> str:
        return self.metric.values[self.position]


def selectable() -> dict[str, Selectable]:
    """``train.select_on``'s choices: every value a metric gives a key (cheap, Python only)."""
    return {key: Selectable(m, i) for _, m in metrics() for i, key in enumerate(m.keys)}


def score_tokenized(keys, candidates: dict[int, str],
                    references: dict[int, list[str]]) -> dict[str, float]:
    """The values ``keys`` (names of :func:`selectable`) of text tokenized already (no PTB,
    no Java): each epoch's validation."""
    choices = selectable()
    refs = check_inputs(candidates, references)
    texts = Texts(refs, {k: [c] for k, c in candidates.items()}, dict(candidates))
    computed: dict[int, Sequence] = {}  # by id(metric): each metric computed once
    out = {}
    for key in keys:
        metric, position = choices[key]
        if id(metric) not in computed:
            computed[id(metric)] = metric.compute(texts)
        out[key] = float(computed[id(metric)][position])
    return out


def _run(metric: Metric, texts: Texts, filed: dict, unavailable: dict) -> np.ndarray | None:
    """File ``metric``'s values; a failure, or a value that is not a finite number, becomes
    None plus a reason (a count stays an int). Its per-image statistics, when it has some."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap prints
            values, statistics = metric.scored(texts)
        if len(values) != len(metric.values):
            raise RuntimeError(f"scorer returned {len(values)} values for "
                               f"{len(metric.values)} metrics")
    except Exception as exc:  # noqa: BLE001 - a metric must never end the run
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        for name in metric.values:
            filed[name], unavailable[name] = None, f"scorer failed: {reason}"
        return None
    for name, value in zip(metric.values, values):
        if isinstance(value, int) and not isinstance(value, bool):
            filed[name] = value
        elif value is None:
            filed[name], unavailable[name] = None, "undefined for these captions"
        elif math.isfinite(value):
            filed[name] = float(value)
        else:
            filed[name], unavailable[name] = None, f"scorer returned {value}"
    return statistics


def score(candidates: dict[int, str], references: dict[int, list[str]], *,
          spice: bool = True, skip: Collection[str] = (), max_refs: int = 0) -> dict:
    """:func:`scored_images`' scores (what metrics.json holds)."""
    return scored_images(candidates, references, spice=spice, skip=skip, max_refs=max_refs)[0]


def scored_images(candidates: dict[int, str], references: dict[int, list[str]], *,
                  spice: bool = True, skip: Collection[str] = (), max_refs: int = 0
                  ) -> tuple[dict, dict]:
    """Tokenize (PTB, or the simple tokenizer without Java), then run every metric: their
    values under their sections (``metrics``, ``diversity``), None plus a reason where one
    cannot run; and the per-image statistics of those that have some (``image_ids`` and,
    per metric, one row per image: what image_statistics.json holds, for the bootstrap).

    ``skip`` names metrics left out (None, "not requested"); ``spice=False`` skips SPICE
    (slow); ``max_refs``: against each image's first that many references (0: all of them;
    Show, Attend and Tell scores against 5 of COCO's 5 to 7)."""
    refs = first_references(check_inputs(candidates, references), max_refs)
    merged: dict[Hashable, list[str]] = {("c", k): [v] for k, v in candidates.items()}
    merged.update({("r", k): v for k, v in refs.items()})
    tokenized, tokenizer = tokenize_any(merged)  # one Java start for both sides
    texts = Texts({k: tokenized[("r", k)] for k in candidates},
                  {k: tokenized[("c", k)] for k in candidates}, dict(candidates))
    sections: dict[str, dict] = {MAIN_SECTION: {}}
    unavailable: dict[str, str] = {}
    per_image: dict[str, list] = {}
    skipped = set(skip) | (set() if spice else {"spice"})
    unknown = sorted(skipped - set(METRICS))
    if unknown:
        raise CapstackError(f"skip: unknown metric {unknown[0]!r} (choose {', '.join(METRICS)})")
    for name, metric in metrics():
        filed = sections.setdefault(metric.section, {})
        missing = f"not requested ({name} skipped)" if name in skipped else metric.missing()
        if missing:
            filed.update({value: None for value in metric.values})
            unavailable.update({value: missing for value in metric.values})
        else:
            statistics = _run(metric, texts, filed, unavailable)
            if statistics is not None:
                per_image[name] = statistics.tolist()
    return ({**sections, "unavailable": unavailable, "tokenizer": tokenizer,
             "images": len(candidates), "max_refs": max_refs},
            {"image_ids": list(texts.candidates), "metrics": per_image})


def score_files(results_path: str | Path, references_path: str | Path, *,
                spice: bool = True, max_refs: int = 0) -> tuple[dict, dict]:
    """Score a COCO results file against a COCO references file: :func:`scored_images`'
    scores and per-image statistics."""
    candidates = load_results(results_path)
    references = load_references(references_path)
    try:
        scored, statistics = scored_images(candidates, references, spice=spice,
                                           max_refs=max_refs)
    except CapstackError as exc:
        raise CapstackError(f"{where(results_path)}: {exc} (references: {references_path})") \
            from None
    scored.update({"results": str(results_path), "references": str(references_path)})
    return scored, statistics


import_modules(__name__, __path__)  # each registers itself
