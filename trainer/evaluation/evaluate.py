"""The evaluation stage: beam search on the test split, the papers' metrics, pictures.

``evaluate_checkpoint`` writes to ``out_dir``:
``results_<split>.json`` (COCO results format; with n captions per image, every caption, each
with its ``rank`` from 1, and rank 1 is the one scored), ``metrics.json`` (approach,
metrics, the reason of every unavailable metric, tokenizer, checkpoint, and under
``"diversity"`` how varied the predicted captions are: distinct-1/2, vocabulary used,
unique captions, mean length; trainer/scoring/metrics/; with n > 1, under
``"diversity"."n_best"``, those of every caption and mBLEU-4:
trainer/scoring/n_best_diversity.py),
``image_statistics.json`` (each image's statistics of the metrics that have some: what
``capstack report --compare`` resamples), ``attention/<image id>.png`` for the first few
images and ``curves.png``.

``evaluate_results`` scores another toolkit's results file into the same kind of folder (its
captions as ``results_given.json``), which the report reads as it reads a run's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline.captions.prepared import load_captions
from pipeline.core.atomic import OUTPUT_MARKER, atomic_dir, writer_of
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.core.ranks import pick_device
from pipeline.core.regular import NotRegular, read_text
from trainer.checkpoint import check_identity, identity
from trainer.objectives import table_labels_of
from trainer.config import EvalConfig, ExperimentConfig, from_dict
from trainer.data import Features, covered, eval_batches
from trainer.decoding import DecodingConfig
from trainer.evaluation.ensembles import (RUN_JOIN, check_same_members, joined,
                                         load_decoder)
from trainer.evaluation.evaluations import GIVEN_RESULTS, recipe_digest
from trainer.evaluation.figures import training_curves
from trainer.evaluation.loaded import load_model  # noqa: F401  (benchmarks import it here)
from trainer.evaluation.pictures import Pictures
from trainer.evaluation.predict import predict
from trainer.scoring.metrics import STATISTICS_FILE, score_files, scored_images
from trainer.scoring.n_best_diversity import n_best_diversity
from trainer.scoring.references import load_ranked_results, load_references

EVAL_BATCH = 50
N_BEST = "n_best"  # metrics.json's diversity.n_best: the figures over every caption (n > 1)


def setting_of(config: ExperimentConfig, s: EvalConfig, checkpoint: str,
               experiment: str = "") -> dict:
    """What made this row, for the report to tell rows apart (it shows those that vary): the
    run, its decoder, objective and reward, the features (their files' names), the seed, and
    the decoding and scoring settings; ``experiment``, the named experiment whose row it is
    (``capstack evaluate --experiment``, which a stages file passes the engine's
    ``${experiment}``; empty for the baseline's); ``recipe``, the digest of :func:`recipe_of`
    (rows merge over seeds only when it is the same)."""
    reward = getattr(config.objective.config, "reward", None)
    return {"experiment": experiment,
            "run": str(Path(checkpoint).parent), "decoder": config.decoder.name,
            "objective": config.objective.name, "reward": getattr(reward, "name", ""),
            "features": "+".join(Path(f).stem for f in config.data.features),
            "seed": config.train.seed, "beam": s.beam_size, "max_len": s.max_len,
            "split": s.split, "max_refs": s.max_refs, "decoding": s.describe(),
            "recipe": recipe_digest(recipe_of(config))}


def recipe_of(config: ExperimentConfig) -> dict:
    """The experiment a run was trained with, but for its seed (what runs over seeds differ
    in), its name (the row's approach) and ``eval:`` (what the evaluation ran with is the
    setting's own): two runs of one recipe differ only by chance."""
    experiment = config.to_dict()
    kept = {key: value for key, value in experiment.items() if key not in ("name", "eval")}
    return {**kept, "train": {k: v for k, v in experiment["train"].items() if k != "seed"}}


def eval_settings(saved: EvalConfig, decoding: DecodingConfig | Mapping[str, Any] | None = None,
                  where: str = "capstack evaluate", **given) -> EvalConfig:
    """The experiment's ``eval:`` settings, with ``decoding``'s laid over them (a
    :class:`DecodingConfig`: all of its options; a mapping: the options it names) and then
    those given on the command line (not None); checked as the ``eval:`` block is, refusals
    naming ``where``. The one place evaluate and caption lay their options over ``eval:``."""
    if isinstance(decoding, DecodingConfig):
        decoding = asdict(decoding)
    chosen = {**asdict(saved), **dict(decoding or {}),
              **{k: v for k, v in given.items() if v is not None}}
    return from_dict(EvalConfig, chosen, where, "eval.")


def evaluate_checkpoint(checkpoint: str | Path | Sequence[str | Path], out_dir: str | Path, *,
                        split: str | None = None, beam_size: int | None = None,
                        max_len: int | None = None, figures: int | None = None,
                        max_refs: int | None = None, device: str = "auto", spice: bool = True,
                        decoding: DecodingConfig | Mapping[str, Any] | None = None,
                        experiment: str = "") -> dict:
    """Beam search on a split, scored; settings from the experiment's ``eval:`` unless given.
    ``experiment``: the named experiment whose row this is, recorded in the setting ("": the
    baseline's; :func:`setting_of`).
    ``decoding`` lays decoding options over the experiment's (trainer/decoding/options.py):
    a mapping such as ``{"search": "diverse", "group_size": 2}``, or a whole
    :class:`DecodingConfig`. ``checkpoint`` as a list (or tuple), even of one: the runs'
    ensemble (trainer/ensemble.py), decoded with the first run's data and ``eval:`` settings."""
    if not isinstance(checkpoint, (str, Path)):
        check_same_members(Path(out_dir), list(checkpoint))
    loaded = load_decoder(checkpoint)
    model, vocab, config = loaded.model, loaded.vocab, loaded.config
    s = eval_settings(config.eval, decoding, split=split, beam_size=beam_size, max_len=max_len,
                      figures=figures, max_refs=max_refs)
    captions = load_captions(config.data.captions)
    features = Features(config.data.features, config.data.max_regions, config.data.box_geometry)
    captions = covered(captions, features)
    for member in loaded.members:
        ckpt, member_config = member.checkpoint, member.config
        check_identity(ckpt["identity"],
                       identity(member_config.decoder.name, asdict(member_config.decoder.config),
                                captions.vocab.itow, features.describe()), Path(ckpt["path"]))
    check_evaluation_replaceable(Path(out_dir))
    dev = pick_device(device)
    preds = predict(model.to(dev), vocab, eval_batches(captions, features, s.split, EVAL_BATCH),
                    dev, s.decoding, progress=len(captions.rows(s.split)))
    every_caption = captions_by_image(preds)
    ranked_first = [p for p in preds if p.rank == 1]  # what is scored and drawn
    references = load_references(captions.references_path(s.split))
    scores, statistics = scored_images({p.image_id: " ".join(p.words) for p in ranked_first},
                                       references, spice=spice, max_refs=s.max_refs)
    if s.n > 1:
        scores["diversity"] = {**scores.get("diversity", {}),
                               N_BEST: n_best_diversity(every_caption)}
    row = row_of(loaded, s, experiment)
    what = {key: row.pop(key) for key in ("checkpoint", "epoch", "setting")}
    metrics = {**row, **scores, **dataclasses.asdict(s), **what}
    with evaluation_folder_written(Path(out_dir)) as folder:
        write_json(folder / f"results_{s.split}.json", results_of(preds, s.n))
        write_json(folder / "metrics.json", metrics)
        write_json(folder / STATISTICS_FILE, statistics, indent=None)
        if s.figures:  # an ensemble's steps give no attention: no attention pictures
            pictures = Pictures(ranked_first[:s.figures], vocab, features, captions, folder, dev,
                                s.max_len)
            pictures.attention()
            model.figures(pictures)  # what else the decoder shows (stages, goals)
        run_dir = Path(loaded.members[0].checkpoint["path"]).parent
        if not loaded.ensemble and (run_dir / "metrics.jsonl").is_file():
            before = _starting_log(config.train.init_from)
            training_curves(run_dir / "metrics.jsonl", folder / "curves.png", before=before,
                            labels=(_training_of(before), loaded.members[0].checkpoint["table"]
                                    ["training"]))
    return metrics


def evaluate_results(results: str | Path, references: str | Path, out_dir: str | Path | None,
                     *, name: str | None = None, max_refs: int = 0, spice: bool = True) -> dict:
    """Score a results file of any toolkit (COCO's results format, self-critical.pytorch's
    eval output, capstack's own: :func:`~trainer.scoring.references.load_ranked_results`)
    against COCO references; with ``out_dir``, written as an evaluation that ``report``,
    ``report --compare`` and ``--baseline`` read as they read a run's: metrics.json (the
    approach ``name``, else the file's stem; no training recorded), image_statistics.json,
    and the captions in COCO's format (:data:`GIVEN_RESULTS`; every rank)."""
    if out_dir is not None:
        check_evaluation_replaceable(Path(out_dir))
    approach = name if name is not None else Path(results).stem
    if not approach.strip():
        raise CapstackError(f"--name: {approach!r}: the approach needs a name (the report's "
                            f"Approach column)")
    ranked = load_ranked_results(results)
    scores, statistics = score_files(results, references, spice=spice, max_refs=max_refs)
    metrics = {"approach": approach, **scores, "setting": {"max_refs": max_refs}}
    if out_dir is not None:
        with evaluation_folder_written(Path(out_dir)) as folder:
            write_json(folder / "metrics.json", metrics)
            write_json(folder / STATISTICS_FILE, statistics, indent=None)
            ranks = any(len(captions) > 1 for captions in ranked.values())
            write_json(folder / GIVEN_RESULTS, [
                {"image_id": image_id, "caption": caption, **({"rank": rank} if ranks else {})}
                for image_id, captions in ranked.items()
                for rank, caption in enumerate(captions, start=1)], indent=None)
    return metrics


# -- an evaluation's files change together ------------------------------------------------------
# report reads metrics.json, --compare/--baseline/--versus-xe resample image_statistics.json, the
# pictures show results_<split>.json: written one by one, a stop between two of them (SIGTERM
# while scoring, a full disk on the last write) left a folder whose files came from two
# evaluations, and the comparisons resampled the old statistics under the new metrics' name. An
# evaluation is written whole into a folder beside its place, then renamed into it.
EVALUATION_FILES = re.compile(r"metrics\.json|image_statistics\.json|results_\w+\.json|"
                              r"curves\.png|attention|stages|goals")


def check_evaluation_replaceable(out_dir: Path) -> None:
    """Refuse, before any decoding, an ``out_dir`` that an evaluation may not replace whole:
    not a folder, one another command wrote, or one holding what no evaluation writes (an
    evaluation folder of an older capstack, without the marker, holds only an evaluation's
    files and is replaced)."""
    if not (out_dir.exists() or out_dir.is_symlink()):
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        what = "a symbolic link" if out_dir.is_symlink() else "not a folder"
        raise CapstackError(f"{out_dir}: {what}; an evaluation writes a folder of its own: "
                            f"choose another --out")
    wrote = writer_of(out_dir)
    if wrote not in (None, "", "evaluate"):
        raise CapstackError(f"{out_dir}: `capstack {wrote}` wrote it; an evaluation replaces its "
                            f"folder whole: choose another --out")
    others = sorted(p.name for p in out_dir.iterdir()
                    if p.name != OUTPUT_MARKER and not EVALUATION_FILES.fullmatch(p.name))
    if wrote is None and others:
        shown = ", ".join(others[:5]) + (f", ... ({len(others)})" if len(others) > 5 else "")
        raise CapstackError(f"{out_dir}: holds what an evaluation does not write ({shown}); an "
                            f"evaluation replaces its folder whole: choose another --out")


@contextmanager
def evaluation_folder_written(out_dir: Path):
    """A fresh folder for the block to write an evaluation into, which then takes the place of
    ``out_dir`` whole (the evaluation before it gone with it): stopped or failed in the block,
    ``out_dir`` is left as it was, and the folder removed."""
    check_evaluation_replaceable(out_dir)
    with atomic_dir(out_dir, "evaluate", force=True) as folder:
        yield folder


def row_of(loaded, s: EvalConfig, experiment: str = "") -> dict:
    """metrics.json's account of what was evaluated: the approach, objective, training labels,
    recipe (:func:`recipe_of`), checkpoint, epoch and :func:`setting_of`. An ensemble's
    approach is ``ensemble: NAMES``, its recipes, checkpoints and epochs are lists, and its
    setting joins the members' runs, decoders, objectives, rewards, seeds and recipes with
    ``+`` and counts them under ``ensemble``."""

    members = loaded.members
    settings = [setting_of(m.config, s, m.checkpoint["path"], experiment) for m in members]
    first = members[0]
    if not loaded.ensemble:
        return {"approach": first.config.name, "objective": first.config.objective.name,
                **first.checkpoint["table"], "recipe": recipe_of(first.config),
                "checkpoint": first.checkpoint["path"],
                "epoch": first.checkpoint["best_epoch"] + 1, "setting": settings[0]}
    tables = [m.checkpoint["table"] for m in members]
    setting = {**settings[0], "run": RUN_JOIN.join(x["run"] for x in settings),
               **{key: joined([x[key] for x in settings])
                  for key in ("decoder", "objective", "reward", "seed", "recipe")},
               "ensemble": len(members)}
    return {"approach": f"ensemble: {joined([m.config.name for m in members])}",
            "objective": setting["objective"], "recipe": [recipe_of(m.config) for m in members],
            **{key: joined([t.get(key, "") for t in tables]) for key in tables[0]},
            "checkpoint": [m.checkpoint["path"] for m in members],
            "epoch": [m.checkpoint["best_epoch"] + 1 for m in members], "setting": setting}


def captions_by_image(preds: list) -> dict[int, list[list[str]]]:
    """Every caption of each image, in rank order: what the n-best diversity figures read."""
    by_image: dict[int, list[list[str]]] = {}
    for p in preds:
        by_image.setdefault(p.image_id, []).append(p.words)
    return by_image


def results_of(preds: list, n: int) -> list[dict]:
    """The results file's entries: COCO's {image_id, caption} for one caption per image; with
    ``n`` > 1 every caption, each with its ``rank`` (1: the one scored)."""
    if n == 1:
        return [{"image_id": p.image_id, "caption": " ".join(p.words)} for p in preds]
    return [{"image_id": p.image_id, "caption": " ".join(p.words), "rank": p.rank}
            for p in preds]


def _training_of(log_path: Path | None) -> str:
    """The Training name (XE, SCST, ...) of the run whose log this is, from the experiment
    saved beside it; XE when there is none."""
    if log_path is None:
        return "XE"
    try:
        return table_labels_of(json.loads(read_text(log_path.parent / "config.json",
                                                    "a run config")))["training"]
    except (OSError, ValueError, NotRegular):  # no config beside the log, or an unreadable one
        return "XE"


def _starting_log(init_from: str) -> Path | None:
    """The training log of the run an RL run started from (its XE phase), when still there."""
    if not init_from:
        return None
    start = Path(init_from)
    log_path = (start if start.is_dir() else start.parent) / "metrics.jsonl"
    return log_path if log_path.is_file() else None
