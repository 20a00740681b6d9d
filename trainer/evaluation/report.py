"""The papers' comparison table: one row per evaluation, metrics in percent.

Each row says how its model was trained (``Training``: the objective's label,
XE, SCST, C2F, which evaluate records with the objective's family). Rows of
several families make one block each, as in Stack-Cap's Tables 1 and 2:
cross-entropy first, then reinforcement. The report reads metrics.json files
only; it knows no objective.

Rows say what differs between them: of the settings evaluate records (``setting``: the named
experiment whose stage ran it, the number of runs of an ensemble, the decoder, the reward, the
features, the seed, the beam, the decoding length, the split, the references scored against),
each that varies across the rows is a column after Training;
the run's folder too when rows would otherwise read the same. The table is written as
markdown, CSV and JSON.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError, where
from pipeline.core.jsonfile import write_json
from trainer.evaluation.compare import difference_over
from trainer.evaluation.evaluations import read_metrics_doc, setting_of, training_of
from trainer.scoring.metrics import table_columns

LABEL_COLUMNS = ["Approach", "Training"]
# the settings a column shows when they vary across the rows (metrics.json's "setting"), in order
SETTING_COLUMNS = ("experiment", "ensemble", "decoder", "reward", "features", "seed", "beam",
                   "max_len", "decoding", "split", "max_refs")
NA = "n/a"
NONE = "-"  # a setting a row has none of (no reward: cross-entropy)
EMPTY = {"experiment": "baseline"}  # what an empty setting reads as, where not NONE
FAMILIES = {"cross-entropy": "Cross-entropy training",  # an objective's family -> its block
            "reinforcement": "Reinforcement with CIDEr-D rewards",
            "": "Training not recorded"}



def columns(settings: Sequence[str] = ()) -> list[str]:
    """The table's columns: the labels, the ``settings`` shown, then each registered metric's
    (trainer/scoring/metrics/)."""
    return LABEL_COLUMNS + list(settings) + [column for column, _ in table_columns()]


def varying(settings: list[dict], labels: list[tuple]) -> list[str]:
    """The settings to show: each of :data:`SETTING_COLUMNS` whose value is not the same in
    every row, then ``run`` when two rows would read the same without it."""
    shown = [k for k in SETTING_COLUMNS
             if len({str(s.get(k, "")) for s in settings}) > 1]
    keys = [(*label, *(str(s.get(k, "")) for k in shown)) for label, s in zip(labels, settings)]
    if len(set(keys)) < len(keys) and len({str(s.get("run", "")) for s in settings}) > 1:
        shown.append("run")
    return shown


def _percent(value: Any) -> float | str:
    """0.362 -> 36.2 (papers report every metric, CIDEr included, x100); None/NaN -> "n/a"."""
    if value is None or not math.isfinite(float(value)):
        return NA
    return round(float(value) * 100, 1)


def _block_order(family: str) -> int:
    """Cross-entropy, then reinforcement, then other families, then rows without one."""
    known = [f for f in FAMILIES if f]
    return known.index(family) if family in known else len(known) + (family == "")


def one_line(text: Any) -> str:
    """``text`` with every run of whitespace (line breakers included) as one space: a table row
    or a note stays one line of metrics.csv and metrics.md."""
    return " ".join(str(text).split())


def metrics_table(rows: list[tuple], versus_xe: bool = False,
                  baseline: str | None = None) -> pd.DataFrame:
    """One row per (approach, score()["metrics"][, training[, family[, setting]]]); columns
    exactly :func:`columns` of the settings that vary (:func:`varying`).

    Rows that differ only in their seed (and run) are one row over the seeds
    (:func:`over_seeds`): each metric's mean ± standard deviation, and ``n``, a column then.
    Rows are ordered block by block (cross-entropy, then reinforcement, ...), in the given
    order within a block; ``table.attrs["families"]`` holds each row's family. Approach and
    training labels are put on one line (:func:`one_line`).

    ``versus_xe``: a column :data:`VERSUS_XE` for every row trained otherwise than by
    cross-entropy: its CIDEr minus that of the cross-entropy row of the same approach, decoder,
    features and seeds, with the 95 % interval of the paired bootstrap over the images (each
    seed's images, over seeds), from the evaluation folders the settings name.
    ``baseline``: an evaluation folder; a column of every row's CIDEr against the row holding
    it, likewise (:func:`baseline_column`).
    """
    defaults: list[Any] = ["", "", {}]  # training, family, setting
    rows = over_seeds([(approach, [metrics], *rest, *defaults[len(rest):])
                       for approach, metrics, *rest in rows])
    rows = sorted(rows, key=lambda r: _block_order(r[3]))
    settings = varying([setting for *_, setting in rows],
                       [(one_line(r[0]), one_line(r[2])) for r in rows])
    counted = any(len(runs) > 1 for _, runs, *_ in rows)
    against = dict([(VERSUS_XE, versus_column(rows))] if versus_xe else [])
    if baseline:
        title, cells = baseline_column(rows, baseline)
        against[title] = cells
    table = pd.DataFrame([[one_line(approach), one_line(training),
                           *[one_line(setting.get(k, "")) or EMPTY.get(k, NONE) for k in settings],
                           *([len(runs)] if counted else []),
                           *(cells[k] for cells in against.values()),
                           *[_over(runs, value) for _, value in table_columns()]]
                          for k, (approach, runs, training, _, setting) in enumerate(rows)],
                         columns=columns([*settings, *(["n"] if counted else []), *against]),
                         dtype=object)
    table.attrs["families"] = [family for *_, family, _ in rows]
    return table


# what differs between the runs of one experiment over seeds (and the evaluation folder)
SEED_KEYS = ("seed", "run", "evaluation")
VERSUS_XE = "CIDEr vs XE (95%)"
PARTNER_KEYS = ("decoder", "features", "seed")  # what an XE row shares with the rows after it


def versus_column(rows: list[tuple]) -> list[str]:
    """:data:`VERSUS_XE`'s cells: ``-`` for cross-entropy rows, ``n/a`` without a partner."""
    cells = []
    for approach, _, _, family, setting in rows:
        if family in ("cross-entropy", ""):
            cells.append(NONE)
            continue
        experiment = setting.get("experiment", "")
        partners = [s for a, _, _, f, s in rows if a == approach and f == "cross-entropy"
                    and all(str(s.get(k)) == str(setting.get(k)) for k in PARTNER_KEYS)]
        # the experiment's own XE row, else the baseline's it shares
        partner = next((s for s in partners if s.get("experiment", "") == experiment), None) \
            or next((s for s in partners if not s.get("experiment")), None)
        cells.append(NA if partner is None else versus_cell(setting, partner))
    return cells


def baseline_column(rows: list[tuple], folder: str) -> tuple[str, list[str]]:
    """The column of each row's CIDEr against the row that holds evaluation ``folder`` (its
    title names that row): ``-`` on that row."""
    wanted = str(Path(folder))
    chosen = next((k for k, (*_, setting) in enumerate(rows)
                   if wanted in [str(Path(f)) for f in _folders(setting)]), None)
    if chosen is None:
        raise CapstackError(f"--baseline {folder}: not one of the evaluations reported")
    approach, _, training, _, partner = rows[chosen]
    title = f"CIDEr vs {one_line(approach)} {one_line(training)} (95%)".replace("  ", " ")
    return title, [NONE if k == chosen else versus_cell(setting, partner)
                   for k, (*_, setting) in enumerate(rows)]


def versus_cell(setting: dict, partner: dict) -> str:
    """A row's CIDEr minus its partner row's, with the paired bootstrap's 95 % interval over
    the images: seed with seed where they share seeds, else run for run; ``n/a`` when the
    rows hold different numbers of runs and share no seed."""
    a, b = _paired_folders(setting, partner)
    if not a:
        return NA
    d = difference_over(a, b, "CIDEr")
    return f"{100 * d.difference:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}]"


def over_seeds(rows: list[tuple]) -> list[tuple]:
    """(approach, [metrics, ...], training, family, setting) rows that differ only in their
    seed and run, merged into one whose metrics list holds each seed's, its setting's
    ``seed`` and ``run`` listing them; the first row's place is the merged row's."""
    merged: dict[tuple, tuple] = {}
    for approach, runs, training, family, setting in rows:
        key = (approach, training, family,
               tuple(sorted((k, str(v)) for k, v in setting.items() if k not in SEED_KEYS)))
        seeds = setting.get("seed") is not None and key in merged and str(setting["seed"]) \
            not in str(merged[key][4].get("seed", "")).split(",")
        if seeds:
            kept = merged[key]
            joined = {k: f"{kept[4].get(k, '')},{setting.get(k, '')}" for k in SEED_KEYS}
            merged[key] = (approach, kept[1] + runs, training, family, {**kept[4], **joined})
        else:
            merged[key if key not in merged else (*key, len(merged))] = \
                (approach, runs, training, family, setting)
    return list(merged.values())


def _over(runs: list[dict], value: str) -> float | str:
    """A metric's cell: its percent, or over seeds ``mean ± std`` (std of the seeds, n - 1)."""
    if len(runs) == 1:
        return _percent(runs[0].get(value))
    if any(_percent(r.get(value)) == NA for r in runs):
        return NA
    numbers = [100 * float(r[value]) for r in runs]
    mean = sum(numbers) / len(numbers)
    std = math.sqrt(sum((x - mean) ** 2 for x in numbers) / (len(numbers) - 1))
    return f"{mean:.1f} ± {std:.1f}"


def _unavailable_lines(docs: list[dict]) -> list[str]:
    """One line per metric of the table missing in any run, reasons deduplicated, in the
    table's order."""
    names = [value for _, value in table_columns()]
    reasons: dict[str, list[str]] = {}
    for doc in docs:
        for name in names:
            if doc["metrics"].get(name) is None or name in doc.get("unavailable", {}):
                reason = doc.get("unavailable", {}).get(name, "no value recorded")
                if reason not in reasons.setdefault(name, []):
                    reasons[name].append(reason)
    return [f"{name}: {NA} — {'; '.join(reasons[name])}"
            for name in names if name in reasons]


def _kept_start_lines(docs: list[dict]) -> list[str]:
    """Rows whose best checkpoint is still the one their run started from (epoch 0), said."""
    return [f"{d['approach']} ({training_of(d)[0]}"
            f"{', experiment ' + e if (e := setting_of(d).get('experiment')) else ''}"
            f"{', seed ' + str(setting_of(d)['seed']) if 'seed' in setting_of(d) else ''}): no "
            f"epoch beat the checkpoint it started from on validation CIDEr; the row is that "
            f"start checkpoint" for d in docs if d.get("epoch") == 0]


def _cell(value: Any) -> str:
    text = f"{value:.1f}" if isinstance(value, float) else str(value)
    return one_line(text).replace("|", "\\|")


def _markdown_rows(table: pd.DataFrame) -> list[str]:
    lines = ["| " + " | ".join(table.columns) + " |",
             "|" + "---|" * len(table.columns)]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |"
                    for row in table.itertuples(index=False)]


def _blocks(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) per family present, in the table's (block) order."""
    families = table.attrs.get("families") or [""] * len(table)
    present = list(dict.fromkeys(families))
    return [(FAMILIES.get(f, f"{f.capitalize()} training"),
             table[[g == f for g in families]]) for f in present]


def markdown(table: pd.DataFrame, notes: list[str]) -> str:
    """Markdown tables (header, |---| row, rows), one per block when rows of several blocks
    are present, each under its bold title; then one note line per unavailable metric."""
    blocks = _blocks(table)
    if len(blocks) == 1:
        lines = _markdown_rows(table)
    else:
        lines = []
        for title, rows in blocks:
            labels = list(dict.fromkeys(rows["Training"]))
            titled = f"{title} ({', '.join(labels)})" if len(labels) > 1 else title
            lines += ([""] if lines else []) + [f"**{titled}**", ""] + _markdown_rows(rows)
    if notes:
        lines += [""] + [one_line(note) for note in notes]
    return "\n".join(lines) + "\n"


def _folders(setting: dict) -> list[str]:
    """A row's evaluation folders (one per seed over seeds)."""
    return [f for f in str(setting.get("evaluation", "")).split(",") if f]


def _paired_folders(setting: dict, partner: dict) -> tuple[list[str], list[str]]:
    """The two rows' evaluation folders paired: by seed where they share seeds, else in order
    when they hold as many; ([], []) otherwise."""
    mine, theirs = _folders(setting), _folders(partner)
    seeds_a = str(setting.get("seed", "")).split(",")
    seeds_b = str(partner.get("seed", "")).split(",")
    if len(seeds_a) == len(mine) and len(seeds_b) == len(theirs):
        a, b = dict(zip(seeds_a, mine)), dict(zip(seeds_b, theirs))
        common = sorted(set(a) & set(b))
        if common:
            return [a[s] for s in common], [b[s] for s in common]
    return (mine, theirs) if mine and len(mine) == len(theirs) else ([], [])


def expand_evaluations(given: Sequence[Path]) -> list[Path]:
    """Each given metrics.json, evaluation folder (its metrics.json) or pattern of them
    (``*?[``, as glob reads it: ``exps/seed*/evals/top_down``; the folders and metrics.json
    files it matches), in order; a pattern that matches none is an error naming it."""
    files = []
    for path in map(Path, given):
        matched = [m for m in sorted(map(Path, glob.glob(str(path))))
                   if m.is_dir() or m.name == "metrics.json"] if glob.has_magic(str(path)) \
            else [path]
        if not matched:
            raise CapstackError(f"{path}: no evaluation matches this pattern")
        files += [m / "metrics.json" if m.is_dir() else m for m in matched]
    # a folder reached twice (an experiment's link to the baseline's) is one evaluation
    once: dict[str, Path] = {}
    for f in files:
        once.setdefault(os.path.realpath(f), f)
    return list(once.values())


def write_report(metric_files: list[Path], out_dir: Path, versus_xe: bool = False,
                 baseline: str | None = None) -> tuple[Path, Path]:
    """Write out_dir/metrics.csv, metrics.md and report.json (atomically) from metrics.json
    files (``versus_xe``, ``baseline``: :func:`metrics_table`'s)."""
    if not metric_files:
        raise CapstackError(f"{where(out_dir)}: no metrics files given for the report")
    docs = [read_metrics_doc(p) for p in metric_files]
    table = metrics_table([(d["approach"], d["metrics"], *training_of(d),
                            {**setting_of(d), "evaluation": str(Path(p).parent)})
                           for p, d in zip(metric_files, docs)], versus_xe, baseline)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "metrics.csv", out_dir / "metrics.md"
    with atomic_file(csv_path) as tmp:
        table.to_csv(tmp, index=False)
    write_json(out_dir / "report.json", {
        "columns": list(table.columns), "rows": table.to_dict(orient="records"),
        "evaluations": [{"file": str(p), "approach": d["approach"],
                         "training": training_of(d)[0], "family": training_of(d)[1],
                         "setting": setting_of(d), "metrics": d["metrics"]}
                        for p, d in zip(metric_files, docs)]})
    with atomic_file(md_path) as tmp:
        Path(tmp).write_text(markdown(table, _unavailable_lines(docs) + _kept_start_lines(docs)),
                             encoding="utf-8")
    return csv_path, md_path
