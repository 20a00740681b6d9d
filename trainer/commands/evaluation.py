"""The evaluation commands: evaluate, caption, report; the decoding options they share."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import click

from pipeline.commandline import MAX_CAPTION_WORDS, NamesOf, OutputFile, stage_command
from trainer.commands.training import percent


# option -> (field of trainer/decoding/options.py's DecodingConfig, click parameter); each one's
# default is None: the experiment's eval: value; the choices are the config's own. Kept here, not
# beside the config: importing trainer.decoding loads torch, which `capstack --help` need not.
DECODING_OPTIONS = {
    "--search": ("search", dict(type=NamesOf("trainer.decoding.options:SEARCHES"),
                                help="beam (greedy for --beam 1), greedy, or diverse beam search "
                                     "[the experiment's eval.search]")),
    "--sample-method": ("sample_method", dict(
        type=NamesOf("trainer.decoding.options:SAMPLE_METHODS"),
        help="How one-word-at-a-time decoding picks a word: the most probable, or a draw "
             "[eval.sample_method]")),
    "--temperature": ("temperature", dict(type=float, help="Sampling temperature; in beam "
                                          "search it tempers the scores [eval.temperature]")),
    "--top-k": ("top_k", dict(type=int, help="Draw among the K most probable words, 0 all "
                              "[eval.top_k]")),
    "--top-p": ("top_p", dict(type=float, help="Draw from the nucleus of probability P, 1 all "
                              "[eval.top_p]")),
    "--length-penalty": ("length_penalty", dict(help="none, wu_ALPHA or avg_ALPHA: how beam "
                                                     "search ranks lengths [eval.length_penalty]")),
    "--group-size": ("group_size", dict(type=int, help="Diverse beam search's groups "
                                        "[eval.group_size]")),
    "--diversity-lambda": ("diversity_lambda", dict(type=float, help="Diverse beam search's "
                                                    "penalty per earlier group's same word "
                                                    "[eval.diversity_lambda]")),
    "--block-trigrams/--allow-trigrams": ("block_trigrams", dict(
        default=None, help="No trigram twice in a caption [eval.block_trigrams]")),
    "--remove-bad-endings/--keep-bad-endings": ("remove_bad_endings", dict(
        default=None, help="No caption ends with a, the, of, ... [eval.remove_bad_endings]")),
    "--bad-endings": ("bad_endings", dict(help="The words no caption may end with, comma "
                                               "separated (with --remove-bad-endings) "
                                               "[eval.bad_endings]")),
    "--no-repeats/--allow-repeats": ("no_repeats", dict(
        default=None, help="No word twice in a row [eval.no_repeats]")),
    "--n": ("n", dict(type=int, aliases=("--n-best",),
                      help="Captions per image: the beam's n best or n samples; with n > 1 "
                           "metrics.json's diversity.n_best says how varied they are [eval.n]")),
}


def decoding_options(command):
    """The decoding options (:data:`DECODING_OPTIONS`) on a command, handed to it as one
    ``decoding`` mapping of the fields given ({} when none is)."""
    fields = [field for field, _ in DECODING_OPTIONS.values()]

    @functools.wraps(command)
    def run(**kwargs):
        given = {f: kwargs.pop(f) for f in fields}
        if given["bad_endings"] is not None:
            given["bad_endings"] = [w.strip() for w in given["bad_endings"].split(",")
                                    if w.strip()]
        return command(decoding={f: v for f, v in given.items() if v is not None}, **kwargs)

    for flag, (field, settings) in reversed(DECODING_OPTIONS.items()):
        settings = dict(settings)
        aliases = settings.pop("aliases", ())  # other names of the option (--n-best for --n)
        run = click.option(flag, *aliases, field, **{"default": None, **settings})(run)
    return run


@stage_command("evaluate", code="trainer.evaluation.evaluate")
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=Path),
                metavar="TARGET...")
@click.option("--refs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Score TARGET as a results file (COCO's format, self-critical.pytorch's "
                   "eval output, capstack's own) against these references: with --out, an "
                   "evaluation that report and report --compare read as a run's.")
@click.option("--name", default=None,
              help="With --refs: the approach the report names it [TARGET's file name "
                   "without .json].")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where results, metrics.json and figures go [evals/NAME beside the runs/ "
                   "folder holding RUN, as the stages write it: runs/top_down -> "
                   "evals/top_down].")
@click.option("--split", type=NamesOf("trainer.config:SPLITS"), default=None,
              help="[the experiment's eval.split]")
@click.option("--beam", "beam_size", type=click.IntRange(1, 100), default=None,
              help="Beam size [the experiment's eval.beam_size].")
@click.option("--max-len", type=click.IntRange(1, MAX_CAPTION_WORDS), default=None,
              help="[the experiment's eval.max_len]")
@click.option("--figures", type=click.IntRange(0, 1000), default=None,
              help="Attention figures of the first N images [the experiment's eval.figures].")
@click.option("--max-refs", type=click.IntRange(0, 100), default=None,
              help="Score against each image's first N references, 0 all "
                   "[the experiment's eval.max_refs].")
@click.option("--device", default="auto", show_default=True)
@click.option("--ensemble", is_flag=True,
              help="Decode with the runs TARGET... as one: each word's probability the mean of "
                   "theirs (one vocabulary, the same features) [evals/ensemble-A+B-DIGEST "
                   "beside the first run's].")
@click.option("--experiment", default="", metavar="NAME",
              help="The named experiment this evaluation is a row of, recorded in metrics.json's "
                   "setting (a stage passes the engine's ${experiment}; empty: the baseline's).")
@decoding_options
def evaluate_cmd(targets, refs, name, out_dir, split, beam_size, max_len, figures, max_refs,
                 device, ensemble, experiment, decoding):
    """Beam-search a checkpoint (or run folder) on a split and score it, as the experiment's
    eval: section says unless options override it; several with --ensemble, as one model; or
    score RESULTS --refs REFS. The decoding options (--search, --sample-method, ..., --n) are
    docs/training.md's "Decoding options"."""
    from trainer.evaluation.evaluate import evaluate_checkpoint, evaluate_results
    from trainer.runs import evaluation_folder

    target = several_need_ensemble(targets, ensemble, "TARGET")
    if name is not None and refs is None:
        raise click.UsageError("--name: only with --refs (a run's evaluation is named by its "
                               "experiment)")
    if refs is not None:
        if ensemble:
            raise click.UsageError("--ensemble: only for runs; with --refs TARGET is a results "
                                   "file, already decoded")
        given = [flag for flag, value in (("--split", split), ("--beam", beam_size),
                                          ("--max-len", max_len), ("--figures", figures))
                 if value is not None]
        given += [flag.split("/")[0] for flag, (field, _) in DECODING_OPTIONS.items()
                  if field in decoding]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only for a checkpoint; with --refs "
                                   f"TARGET is a results file, already decoded")
        scores = evaluate_results(target, refs, out_dir, name=name, max_refs=max_refs or 0)
    else:
        out_dir = out_dir or (ensemble_folder(targets, evaluation_folder) if ensemble
                              else evaluation_folder(target))
        scores = evaluate_checkpoint(list(targets) if ensemble else target, out_dir,
                                     split=split, beam_size=beam_size, max_len=max_len,
                                     figures=figures, max_refs=max_refs, device=device,
                                     decoding=decoding, experiment=experiment)
    _echo_scores(scores)
    if out_dir:
        click.echo(f"-> {out_dir}/metrics.json")


def several_need_ensemble(given: Sequence[Path], ensemble: bool, name: str) -> Path:
    """The one run given (the first with ``--ensemble``); several without it are refused."""
    if len(given) > 1 and not ensemble:
        raise click.UsageError(f"{name}: {len(given)} runs given ({', '.join(map(str, given))}): "
                               f"add --ensemble to decode them as one, or give one run")
    return given[0]


def ensemble_folder(targets: Sequence[Path], evaluation_folder) -> Path:
    """An ensemble's evaluation folder: ``ensemble-A+B-<digest of the members>`` beside the
    first run's (A, B the runs' evaluation folder names), so it never takes the place of a
    run's own evaluation, nor of another ensemble's."""
    from trainer.evaluation.ensembles import default_folder

    return default_folder(targets, evaluation_folder)


def _echo_scores(scores: dict) -> None:
    for name, value in scores["metrics"].items():
        shown = f"{percent(value):>6}" if value is not None else \
            f"   n/a ({scores['unavailable'].get(name, 'unavailable')})"
        click.echo(f"  {name:<8}{shown}")
    refs = f", first {scores['max_refs']} references" if scores.get("max_refs") else ""
    click.echo(f"  ({scores['images']} images, {scores['tokenizer']} tokenizer{refs})")


@click.command("caption")
@click.option("--checkpoint", "checkpoints", required=True, multiple=True,
              type=click.Path(path_type=Path),
              help="A checkpoint (or run folder: its best.pt); several with --ensemble.")
@click.argument("images", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--attention", type=OutputFile(), default=None,
              help="Draw the attention per word to this PNG. For several images the name holds "
                   "{stem} (each image's file name) or {n} (its place, from 1): "
                   "--attention 'att/{stem}.png'.")
@click.option("--beam", "beam_size", type=click.IntRange(1, 100), default=None,
              help="Beam size [the experiment's eval.beam_size].")
@click.option("--max-len", default=16, show_default=True,
              type=click.IntRange(1, MAX_CAPTION_WORDS))
@click.option("--device", default="auto", show_default=True)
@click.option("--ensemble", is_flag=True,
              help="Decode with every --checkpoint as one: each word's probability the mean of "
                   "theirs (one vocabulary, the same features; no attention).")
@decoding_options
def caption_cmd(checkpoints, images, attention, beam_size, max_len, device, ensemble, decoding):
    """Caption raw IMAGES, running the extractor that made the checkpoint's feature stores.
    The decoding options other than --max-len default to the experiment's eval: values (--beam
    too, as evaluate's); with --n N each image's N captions are printed with their rank."""
    from pipeline.core.ranks import pick_device
    from pipeline.features.extract.rebuild import image_extractor
    from trainer.evaluation.caption import caption_files

    checkpoint = several_need_ensemble(checkpoints, ensemble, "--checkpoint")
    if ensemble and attention is not None:
        raise click.UsageError("--attention: an ensemble draws no attention (no member's "
                               "attention is the ensemble's); caption without --attention, or "
                               "draw one run's")
    dev = pick_device(device)
    captions = caption_files(list(checkpoints) if ensemble else checkpoint, list(images),
                             lambda meta, where: image_extractor(meta, where, dev),
                             beam_size=beam_size, max_len=max_len, attention=attention,
                             device=dev, decoding=decoding)
    ranked = any(c.rank > 1 for c in captions)
    for c in captions:
        notes = ([f"{c.regions} regions"] if c.regions is not None else []) + \
            ([f"attention -> {c.attention}"] if c.attention else
             ["no attention to draw: the decoder attends over no single grid or set of regions"]
             if attention else [])
        drawn = f"  [{'; '.join(notes)}]" if notes else ""
        rank = f" [{c.rank}]" if ranked else ""
        click.echo(f"{c.path}{rank}: {' '.join(c.words)}{drawn}")


@stage_command("report", code="trainer.evaluation.report")
@click.argument("metrics", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", default="reports", show_default=True,
              type=click.Path(file_okay=False, path_type=Path))
@click.option("--compare", nargs=2, type=click.Path(path_type=Path), default=None,
              metavar="A B", help="Two evaluation folders of the same images: A - B per value, "
                                  "its interval and how often A is ahead, by the paired "
                                  "bootstrap over the images (OUT/compare.md, compare.json). "
                                  "Each side may be several, by a pattern "
                                  "('exps/seed*/evals/top_down') or commas: every seed's "
                                  "images, seed paired with seed.")
@click.option("--resamples", default=1000, show_default=True, type=click.IntRange(1, 100_000),
              help="--compare: bootstrap resamples.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**32 - 1),
              help="--compare: the resamples' seed (the same seed, the same result).")
@click.option("--versus-xe", is_flag=True,
              help="A column for every row not trained by cross-entropy: its CIDEr minus that "
                   "of the XE row of the same approach, features and seeds, with the 95% "
                   "interval of the paired bootstrap over the images.")
@click.option("--baseline", default=None, type=click.Path(path_type=Path), metavar="EVAL",
              help="A column of every row's CIDEr minus that of the row holding evaluation "
                   "EVAL, with the 95% interval of the paired bootstrap over the images; "
                   "a row over seeds against a row over the same seeds only, else n/a "
                   "and why below the table.")
@click.option("--gallery", default=None, type=click.Path(path_type=Path), metavar="EVAL",
              help="The evaluation whose captions OUT/index.html lists, image by image [the "
                   "first reported].")
@click.option("--figure", "figure", default=None, type=click.IntRange(1, 100), metavar="K",
              help="--compare: OUT/figure.png and figure.pdf, K images with A's and B's "
                   "captions under each, the first K as OUT/index.html ranks them (A's largest "
                   "CIDEr wins first).")
@click.option("--images", default=None, metavar="ID,...",
              help="--compare: the figure of these images (ids, by commas) instead.")
def report_cmd(metrics, out_dir, compare, resamples, seed, versus_xe, baseline, gallery, figure,
               images):
    """One table of every evaluated experiment (metrics.json files or their folders, or
    patterns of them: 'exps/seed*/evals/top_down'), in %; rows of one recipe differing only
    in their seed are one, over the seeds; with --compare A B, whether A's difference from B
    is real on these images. OUT/index.html shows it in a browser: the table, the training
    curves and one evaluation's captions; with --compare, the images where A's and B's
    captions differ, ranked (with both, the comparison's page is OUT/compare.html)."""
    if not metrics and not compare:
        raise click.UsageError("name the evaluations to report (METRICS...), or --compare A B")
    chosen = _image_ids(images)
    if (figure or chosen) and not compare:
        raise click.UsageError("--figure, --images: a figure of two systems' captions; add "
                               "--compare A B")
    if figure and chosen and figure != len(chosen):
        raise click.UsageError(f"--figure {figure} --images {images}: {len(chosen)} images "
                               f"named; name {figure}, or leave --figure out")
    if gallery and not metrics:
        raise click.UsageError("--gallery: the report's page (METRICS...); --compare's page "
                               "lists both systems' captions")
    if metrics:
        from trainer.evaluation.report import expand_evaluations, write_report

        files = expand_evaluations(metrics)
        csv_path, md_path = write_report(files, out_dir, versus_xe,
                                         str(baseline) if baseline else None, page="index.html",
                                         gallery=gallery)
        click.echo(md_path.read_text().rstrip())
        click.echo(f"-> {csv_path}, {md_path}, {out_dir / 'index.html'}")
    if compare:
        from trainer.evaluation.compare import write_comparison
        from trainer.evaluation.report import expand_evaluations

        a, b = (expand_evaluations(str(side).split(",")) for side in compare)
        written = write_comparison(a, b, out_dir, resamples=resamples, seed=seed,
                                   page="compare.html" if metrics else "index.html",
                                   figure=figure or 0, images=chosen)
        click.echo(written.text.rstrip())
        click.echo(f"-> {', '.join(map(str, [written.json, written.markdown, written.page]))}")
        if written.figure:
            click.echo(f"-> {', '.join(map(str, written.figure))}")


def _image_ids(given: str | None) -> list[int]:
    """``--images 12,15``: the ids, in order."""
    if given is None:
        return []
    try:
        ids = [int(part) for part in given.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{given!r}: image ids by commas (12,15)",
                                 param_hint="--images") from None
    if not ids:
        raise click.BadParameter("no image id", param_hint="--images")
    return ids
