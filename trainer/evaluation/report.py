"""The papers' comparison table: one row per evaluation, metrics in percent.

Each row says how its model was trained (``Training``: the objective's label,
XE, SCST, C2F, which evaluate records with the objective's family). Rows of
several families make one block each, as in Stack-Cap's Tables 1 and 2:
cross-entropy first, then reinforcement. The report reads metrics.json files
only; it knows no objective.

Rows say what differs between them: of the settings evaluate records (``setting``: the named
experiment whose stage ran it, the number of runs of an ensemble, the decoder, the reward, the
features, the seed, the beam, the decoding length, the split, the references scored against),
each that varies across the rows is a column after Training; where rows would still read the
same but were trained by other recipes (``setting.recipe``: all the experiment but the seed),
the recipe's settings that differ between them (``decoder.hidden``, ``train.lr``); the run's
folder too when rows would otherwise read the same. Rows merge over seeds only when their
recipe is recorded and the same. The table is written as markdown, CSV and JSON.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError, where
from pipeline.core.jsonfile import write_json
from trainer.evaluation.compare import difference_over, other_images
from trainer.evaluation.evaluations import (read_evaluation, read_metrics_doc, setting_of,
                                            training_of)
from trainer.scoring.metrics import table_columns

LABEL_COLUMNS = ["Approach", "Training"]
# the settings a column shows when they vary across the rows (metrics.json's "setting"), in order
SETTING_COLUMNS = ("experiment", "ensemble", "decoder", "reward", "features", "seed", "beam",
                   "max_len", "decoding", "split", "max_refs")
NA = "n/a"
NONE = "-"  # a setting a row has none of (no reward: cross-entropy)
UNKNOWN = "?"  # a recipe's setting of a row whose evaluation recorded no recipe
RECIPE = "recipe"  # setting.recipe: the digest of the experiment but its seed (evaluate's)
RECIPE_DEPTH = 4  # a recipe's settings are named this deep (objective.reward.name)
EMPTY = {"experiment": "baseline"}  # what an empty setting reads as, where not NONE
FAMILIES = {"cross-entropy": "Cross-entropy training",  # an objective's family -> its block
            "reinforcement": "Reinforcement with CIDEr-D rewards",
            "": "Training not recorded"}



def columns(settings: Sequence[str] = ()) -> list[str]:
    """The table's columns: the labels, the ``settings`` shown, then each registered metric's
    (trainer/scoring/metrics/)."""
    return LABEL_COLUMNS + list(settings) + [column for column, _ in table_columns()]


def varying(settings: list[dict], labels: list[tuple],
            recipes: Mapping[str, dict] | None = None) -> list[str]:
    """The settings to show: each of :data:`SETTING_COLUMNS` whose value is not the same in
    every row, then the recipe's settings that tell apart rows which would read the same but
    for their seed (:func:`recipe_columns`: else they would read as one model at two seeds),
    then ``run`` when two rows would still read the same."""
    recipes = recipes or {}
    shown = [k for k in SETTING_COLUMNS
             if len({str(s.get(k, "")) for s in settings}) > 1]
    but_seed = [k for k in shown if k not in SEED_KEYS]
    shown += recipe_columns(settings, _read_as(settings, labels, but_seed, recipes), recipes)
    keys = _read_as(settings, labels, shown, recipes)
    if len(set(keys)) < len(keys) and len({str(s.get("run", "")) for s in settings}) > 1:
        shown.append("run")
    return shown


def _read_as(settings: list[dict], labels: list[tuple], shown: list[str],
             recipes: Mapping[str, dict]) -> list[tuple]:
    """How each row reads with the ``shown`` settings: rows alike here look the same."""
    return [(*label, *(shown_value(s, k, recipes) for k in shown))
            for label, s in zip(labels, settings)]


def recipe_columns(settings: list[dict], read_as: list[tuple],
                   recipes: Mapping[str, dict]) -> list[str]:
    """The recipe's settings (``decoder.hidden``, ``train.lr``) that differ between rows which
    read alike (``read_as``) but record other recipes, in the experiment's order; ``recipe``
    (the digest) where a recipe is not recorded whole or none of its settings differ."""
    groups: dict[tuple, set[str]] = {}
    for row, setting in zip(read_as, settings):
        groups.setdefault(row, set()).add(str(setting.get(RECIPE, "")))
    named: dict[str, None] = {}
    digest = False
    for digests in (d for d in groups.values() if len(d) > 1):
        known = [recipes[d] for d in sorted(digests) if d in recipes]
        differ = [k for k in dict.fromkeys(k for flat in known for k in flat)
                  if len({flat.get(k, NONE) for flat in known}) > 1]
        named.update(dict.fromkeys(differ))
        digest = digest or len(known) < len(digests) or not differ
    return list(named) + ([RECIPE] if digest else [])


def shown_value(setting: dict, key: str, recipes: Mapping[str, dict]) -> str:
    """A row's cell of setting ``key``: the setting, its recipe's setting (a dotted key), or
    its recipe's digest (the first 8 digits)."""
    recipe = str(setting.get(RECIPE, ""))
    if key == RECIPE:
        return "+".join(part[:8] for part in recipe.split("+")) or UNKNOWN
    if "." in key:
        flat = recipes.get(recipe)
        return UNKNOWN if flat is None else flat.get(key, NONE)
    return one_line(setting.get(key, "")) or EMPTY.get(key, NONE)


def flat_recipe(recipe: dict | list) -> dict[str, str]:
    """A recipe metrics.json records (evaluate's ``recipe_of``) as dotted settings and their
    values as the table shows them (``decoder.hidden``: ``64``); an ensemble's (a list of
    recipes) each setting as its runs' values joined with ``+``, one value where they agree."""
    if isinstance(recipe, list):
        flats = [flat_recipe(r) for r in recipe]
        keys = dict.fromkeys(k for flat in flats for k in flat)
        values = {k: [flat.get(k, NONE) for flat in flats] for k in keys}
        return {k: v[0] if len(set(v)) == 1 else "+".join(v) for k, v in values.items()}
    flat: dict[str, str] = {}
    _flatten(recipe, "", flat)
    return flat


def _flatten(value: Any, name: str, into: dict[str, str]) -> None:
    if isinstance(value, dict) and name.count(".") < RECIPE_DEPTH - 1:
        for key, item in value.items():
            _flatten(item, f"{name}.{key}" if name else str(key), into)
        return
    if isinstance(value, (dict, list)):
        try:
            into[name] = one_line(json.dumps(value, sort_keys=True))
        except (TypeError, ValueError, RecursionError):  # an edited file's odd value
            into[name] = UNKNOWN
    else:
        into[name] = one_line(value)


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


def metrics_table(rows: list[tuple], versus_xe: bool = False, baseline: str | None = None,
                  recipes: Mapping[str, dict | list] | None = None) -> pd.DataFrame:
    """One row per (approach, score()["metrics"][, training[, family[, setting]]]); columns
    exactly :func:`columns` of the settings that vary (:func:`varying`). ``recipes``: the
    recipe metrics.json records (``recipe``) by its digest (``setting.recipe``), whose
    settings name what differs between rows of other recipes.

    Rows of one recipe that differ only in their seed (and run) are one row over the seeds
    (:func:`over_seeds`): each metric's mean ± standard deviation, and ``n``, a column then.
    Rows are ordered block by block (cross-entropy, then reinforcement, ...), in the given
    order within a block; ``table.attrs["families"]`` holds each row's family and
    ``table.attrs["notes"]`` the lines that say why a row or cell is as it is. Approach and
    training labels are put on one line (:func:`one_line`).

    ``versus_xe``: a column :data:`VERSUS_XE` for every row trained otherwise than by
    cross-entropy: its CIDEr minus that of the cross-entropy row of the same approach, decoder,
    features and seeds, with the 95 % interval of the paired bootstrap over the images (each
    seed's images, over seeds), from the evaluation folders the settings name.
    ``baseline``: an evaluation folder; a column of every row's CIDEr against the row holding
    it, likewise (:func:`baseline_column`).
    """
    defaults: list[Any] = ["", "", {}]  # training, family, setting
    given = [(approach, [metrics], *rest, *defaults[len(rest):])
             for approach, metrics, *rest in rows]
    notes = unrecorded_recipe_lines(given)
    rows = sorted(over_seeds(given), key=lambda r: _block_order(r[3]))
    flat = {str(digest): flat_recipe(recipe) for digest, recipe in (recipes or {}).items()}
    settings = varying([setting for *_, setting in rows],
                       [(one_line(r[0]), one_line(r[2])) for r in rows], flat)
    counted = any(len(runs) > 1 for _, runs, *_ in rows)
    names = [row_name(row, settings, flat) for row in rows]
    against: dict[str, list[str]] = {}
    if versus_xe:
        against[VERSUS_XE] = column_cells(VERSUS_XE, versus_column(rows), names, notes)
    if baseline:
        title, cells = baseline_column(rows, baseline, names)
        against[title] = column_cells(title, cells, names, notes)
    table = pd.DataFrame([[one_line(approach), one_line(training),
                           *[shown_value(setting, k, flat) for k in settings],
                           *([len(runs)] if counted else []),
                           *(cells[k] for cells in against.values()),
                           *[_over(runs, value) for _, value in table_columns()]]
                          for k, (approach, runs, training, _, setting) in enumerate(rows)],
                         columns=columns([*settings, *(["n"] if counted else []), *against]),
                         dtype=object)
    table.attrs["families"] = [family for *_, family, _ in rows]
    table.attrs["notes"] = notes
    return table


def row_name(row: tuple, shown: list[str], recipes: Mapping[str, dict]) -> str:
    """A row as notes and a column's title name it: approach, training and the ``shown``
    settings (``top_down XE, seed 0,1,2``)."""
    approach, _, training, _, setting = row
    label = " ".join(one_line(x) for x in (approach, training) if one_line(x))
    return ", ".join([label, *(f"{k} {shown_value(setting, k, recipes)}" for k in shown)])


# what differs between the runs of one experiment over seeds (and the evaluation folder)
SEED_KEYS = ("seed", "run", "evaluation")
VERSUS_XE = "CIDEr vs XE (95%)"
PARTNER_KEYS = ("decoder", "features", "seed")  # what an XE row shares with the rows after it
EVALUATED_KEYS = ("beam", "max_len", "decoding", "split", "max_refs")  # how a row was decoded


class Cell(NamedTuple):
    """A comparison's cell: its text, why it is ``n/a`` ("" when it is not), and over how many
    pairs of evaluations (seeds) it was made."""

    text: str
    why: str = ""
    pairs: int = 0


def versus_column(rows: list[tuple]) -> list[Cell]:
    """:data:`VERSUS_XE`'s cells: ``-`` for cross-entropy rows, ``n/a`` without a partner."""
    cells = []
    for approach, _, _, family, setting in rows:
        if family in ("cross-entropy", ""):
            cells.append(Cell(NONE))
            continue
        experiment = setting.get("experiment", "")
        partners = [s for a, _, _, f, s in rows if a == approach and f == "cross-entropy"
                    and all(_partner_value(s, k) == _partner_value(setting, k)
                            for k in PARTNER_KEYS)]
        # the experiment's own XE row, else the baseline's it shares; the one decoded alike
        own = [s for s in partners if s.get("experiment", "") == experiment] \
            or [s for s in partners if not s.get("experiment")]
        alike = [s for s in own if all(str(s.get(k)) == str(setting.get(k))
                                       for k in EVALUATED_KEYS)]
        own = alike if len(own) > 1 and alike else own
        if len(own) > 1:
            cells.append(Cell(NA, f"{len(own)} XE rows of this approach, decoder, features, "
                                  f"seeds and decoding: choose one with --baseline"))
        else:
            cells.append(versus_cell(setting, own[0]) if own else
                         Cell(NA, "no XE row of this approach, decoder, features and seeds"))
    return cells


def _partner_value(setting: dict, key: str) -> str:
    """A setting as partners must share it; seeds as a set (``0,1,2`` is ``2,0,1``)."""
    if key == "seed":
        return ",".join(sorted(_seeds(setting)))
    return str(setting.get(key))


def baseline_column(rows: list[tuple], folder: str, names: list[str]
                    ) -> tuple[str, list[Cell]]:
    """The column of each row's CIDEr against the row that holds evaluation ``folder`` (its
    title names that row, as ``names`` names each): ``-`` on that row."""
    wanted = str(Path(folder))
    chosen = next((k for k, (*_, setting) in enumerate(rows)
                   if wanted in [str(Path(f)) for f in _folders(setting)]), None)
    if chosen is None:
        raise CapstackError(f"--baseline {folder}: not one of the evaluations reported")
    partner = rows[chosen][4]
    return f"CIDEr vs {names[chosen]} (95%)", [
        Cell(NONE) if k == chosen else versus_cell(setting, partner)
        for k, (*_, setting) in enumerate(rows)]


def column_cells(title: str, cells: list[Cell], names: list[str], notes: list[str]
                 ) -> list[str]:
    """A comparison column's texts; its notes (why a cell is ``n/a``; how rows over seeds
    were compared) added to ``notes``."""
    notes += [f"{title}: {NA} for {name}: {cell.why}"
              for name, cell in zip(names, cells) if cell.why]
    if any(cell.pairs > 1 for cell in cells):
        notes.append(f"{title}: a row over seeds is compared with a row over the same seeds, "
                     f"seed with seed, every seed's images resampled together (as report "
                     f"--compare): the difference of the two rows' CIDEr over all those images")
    return [cell.text for cell in cells]


def versus_cell(setting: dict, partner: dict) -> Cell:
    """A row's CIDEr minus its partner row's, with the paired bootstrap's 95 % interval over
    the images: run with run for one run each, over seeds seed with seed when both rows
    hold the same seeds; ``n/a`` with the reason otherwise (other seeds, another split, other
    images, no per-image CIDEr)."""
    folders, why = _paired_folders(setting, partner)
    if not folders:
        return Cell(NA, why)
    pairs = [(read_evaluation(a), read_evaluation(b)) for a, b in folders]
    why = next((w for a, b in pairs if (w := other_images(a, b))), "")
    if why:
        return Cell(NA, why)
    d = difference_over(pairs, "CIDEr")
    if d is None:
        return Cell(NA, "an evaluation holds no per-image CIDEr statistics")
    return Cell(f"{100 * d.difference:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}]",
                pairs=len(pairs))


def _merge_key(approach: str, training: str, family: str, setting: dict) -> tuple:
    return (approach, training, family,
            tuple(sorted((k, str(v)) for k, v in setting.items() if k not in SEED_KEYS)))


def over_seeds(rows: list[tuple]) -> list[tuple]:
    """(approach, [metrics, ...], training, family, setting) rows of one recorded recipe
    (``setting.recipe``) that differ only in their seed and run, merged into one whose
    metrics list holds each seed's, its setting's ``seed`` and ``run`` listing them and its
    ``evaluation`` each seed's folder (a list); the first row's place is the merged row's.
    Rows that record no recipe stay one each: nothing says they were trained alike."""
    merged: dict[tuple, tuple] = {}
    for approach, runs, training, family, setting in rows:
        key = _merge_key(approach, training, family, setting)
        seeds = setting.get("seed") is not None and bool(setting.get(RECIPE)) \
            and key in merged and str(setting["seed"]) not in _seeds(merged[key][4])
        if seeds:
            kept = merged[key]
            joined = {k: f"{kept[4].get(k, '')},{setting.get(k, '')}" for k in ("seed", "run")}
            merged[key] = (approach, kept[1] + runs, training, family,
                           {**kept[4], **joined,
                            "evaluation": _folders(kept[4]) + _folders(setting)})
        else:
            merged[key if key not in merged else (*key, len(merged))] = \
                (approach, runs, training, family, setting)
    return list(merged.values())


def unrecorded_recipe_lines(rows: list[tuple]) -> list[str]:
    """A line for each group of rows that differ only in their seed but record no recipe
    (evaluated before evaluate recorded ``setting.recipe``): they stay one row each."""
    seeds: dict[tuple, list[str]] = {}
    for approach, _, training, family, setting in rows:
        if setting.get("seed") is not None and not setting.get(RECIPE):
            seeds.setdefault(_merge_key(approach, training, family, setting), []).append(
                str(setting["seed"]))
    return [f"{one_line(key[0])} ({one_line(key[1]) or 'training not recorded'}), seeds "
            f"{', '.join(dict.fromkeys(found))}: one row each, not merged over seeds: their "
            f"evaluations record no recipe (setting.recipe), so nothing says they were trained "
            f"alike; evaluate them again to merge them"
            for key, found in seeds.items() if len(set(found)) > 1]


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
    """A row's evaluation folders (one per seed over seeds: a list)."""
    folders = setting.get("evaluation") or []
    return [str(f) for f in folders] if isinstance(folders, list) else [str(folders)]


def _seeds(setting: dict) -> list[str]:
    """A row's seeds (several over seeds)."""
    return str(setting.get("seed", "")).split(",")


def _paired_folders(setting: dict, partner: dict) -> tuple[list[tuple[str, str]], str]:
    """The two rows' evaluation folders paired, what the rows show compared: run with run for
    one run each, seed with seed for rows over the same seeds; else none, and why."""
    mine, theirs = _folders(setting), _folders(partner)
    if not mine or not theirs:
        return [], "no evaluation folder recorded"
    split, other = str(setting.get("split", "")), str(partner.get("split", ""))
    if split and other and split != other:
        return [], f"split {split} against {other}: compare evaluations of one split"
    if len(mine) == 1 and len(theirs) == 1:
        return [(mine[0], theirs[0])], ""
    seeds_a, seeds_b = _seeds(setting), _seeds(partner)
    if len(seeds_a) == len(mine) and len(seeds_b) == len(theirs) \
            and len(set(seeds_a)) == len(seeds_a) and sorted(seeds_a) == sorted(seeds_b):
        theirs_by_seed = dict(zip(seeds_b, theirs))
        return [(folder, theirs_by_seed[s]) for s, folder in zip(seeds_a, mine)], ""
    return [], (f"seeds {', '.join(seeds_a)} against {', '.join(seeds_b)}: a row over seeds "
                f"compares with a row over the same seeds only (its mean is over all of them)")


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
                 baseline: str | None = None, *, page: str | None = None,
                 gallery: str | Path | None = None) -> tuple[Path, Path]:
    """Write out_dir/metrics.csv, metrics.md and report.json (atomically) from metrics.json
    files (``versus_xe``, ``baseline``: :func:`metrics_table`'s); with ``page``, also the
    page ``out_dir/page`` (trainer/evaluation/page/: the table, the training curves, and the
    captions of evaluation ``gallery``, the first by default)."""
    if not metric_files:
        raise CapstackError(f"{where(out_dir)}: no metrics files given for the report")
    docs = [read_metrics_doc(p) for p in metric_files]
    recipes = {str(setting_of(d)[RECIPE]): d["recipe"] for d in docs
               if setting_of(d).get(RECIPE) and d.get("recipe")}
    table = metrics_table([(d["approach"], d["metrics"], *training_of(d),
                            {**setting_of(d), "evaluation": str(Path(p).parent)})
                           for p, d in zip(metric_files, docs)], versus_xe, baseline, recipes)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "metrics.csv", out_dir / "metrics.md"
    with atomic_file(csv_path) as tmp:
        table.to_csv(tmp, index=False)
    write_json(out_dir / "report.json", {
        "columns": list(table.columns), "rows": table.to_dict(orient="records"),
        "notes": table.attrs["notes"],
        "evaluations": [{"file": str(p), "approach": d["approach"],
                         "training": training_of(d)[0], "family": training_of(d)[1],
                         "setting": setting_of(d), "metrics": d["metrics"]}
                        for p, d in zip(metric_files, docs)]})
    notes = _unavailable_lines(docs) + _kept_start_lines(docs) + table.attrs["notes"]
    with atomic_file(md_path) as tmp:
        Path(tmp).write_text(markdown(table, notes), encoding="utf-8")
    if page:
        from trainer.evaluation.page import write_report_page

        folders = [Path(p).parent for p in metric_files]
        names = [f"{d['approach']} ({training_of(d)[0]})" if training_of(d)[0]
                 else str(d["approach"]) for d in docs]
        write_report_page(_blocks(table), [one_line(n) for n in notes], folders, names,
                          Path(gallery) if gallery else folders[0], out_dir, page)
    return csv_path, md_path
