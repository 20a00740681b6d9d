"""The training commands: train, runs, import-checkpoint, cider-cache, and the lists of the
registered decoders, objectives and rewards."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from pipeline.commandline import (MAX_BOXES, NamesOf, OutputFile, echo_summaries,
                                  hand_over_to_torchrun, nproc_option, stage_command)


@click.command("import-checkpoint")
@click.argument("kind", metavar="KIND", type=NamesOf("trainer.imports:CHECKPOINT_FORMATS"))
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The run folder to write (its best.pt).")
@click.option("--captions", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The prepared captions it is used with (`capstack prepare`): the same words.")
@click.option("--features", multiple=True, required=True, type=click.Path(path_type=Path),
              help="The feature store(s) it reads (repeatable), of the checkpoint's size.")
@click.option("--max-regions", default=0, show_default=True, type=click.IntRange(0, MAX_BOXES),
              help="Regions read per image; 0: all.")
def import_checkpoint_cmd(kind, sources, out, captions, features, max_regions):
    """Another toolkit's checkpoint as a capstack run folder (rtl: self-critical.pytorch's
    MODEL.pth INFOS.pkl, its updown/topdown and transformer models), for evaluate, caption and
    train.init_from. docs/training.md: "Checkpoints of self-critical.pytorch"."""
    from trainer.imports import import_checkpoint

    done = import_checkpoint(kind, list(sources), out, captions, list(features), max_regions)
    click.echo(f"{done.decoder} decoder, {done.parameters:,} parameters -> {done.checkpoint}")
    for note in done.notes:
        click.echo(f"  note: {note}")


@click.command("decoders")
def decoders_cmd():
    """The registered decoders: name, then what it is."""
    from trainer.decoders import DECODERS

    echo_summaries(DECODERS)


@click.command("objectives")
def objectives_cmd():
    """The registered training objectives: name, then what it is."""
    from trainer.objectives import OBJECTIVES

    echo_summaries(OBJECTIVES)


@click.command("rewards")
def rewards_cmd():
    """The registered RL rewards (an objective's ``reward:``): name, then what it is."""
    from trainer.rewards import REWARDS

    echo_summaries(REWARDS)


@stage_command("train", code="trainer.train")
@click.argument("experiment", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The run folder: checkpoints, metrics log; an existing run resumes.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a value of the experiment file, e.g. train.epochs=3.")
@click.option("--restart-on-change", is_flag=True,
              help="When OUT holds a run of other data or decoder config, move it to OUT.old "
                   "(OUT.old.2, ... when taken: nothing is deleted) and start afresh (instead of "
                   "refusing).")
@click.option("--tensorboard", is_flag=True,
              help="Also write TensorBoard events to OUT/events (train.tensorboard=true; needs "
                   "pip install 'capstack[tensorboard]').")
@nproc_option
def train_cmd(experiment, out_dir, overrides, restart_on_change, tensorboard, nproc):
    """Train (or resume) a decoder on cached features, as the EXPERIMENT yaml says; one line
    per epoch: mean training loss, validation CIDEr (greedy, x100 as the report prints it),
    the best so far, time.

    Under torchrun (or with --nproc N) every process trains its part of each batch (DDP)."""
    hand_over_to_torchrun(nproc)
    import logging

    from pipeline.core.ranks import environment_ranks
    from trainer.config import load_experiment
    from trainer.scoring.text import java_missing
    from trainer.train import train

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    config = load_experiment(experiment, list(overrides) +
                             (["train.tensorboard=true"] if tensorboard else []))
    main_process = environment_ranks().main
    if java_missing() and main_process:
        click.echo("note: METEOR will be n/a at evaluation (java not found)")
    r = train(config, out_dir, restart_on_change=restart_on_change, on_epoch=_echo_epoch)
    if not main_process:
        return
    resumed = f", resumed at epoch {r.resumed_at[0] + 1}" if r.resumed_at else ""
    if r.resumed_at and r.resumed_at[0] >= config.train.epochs:
        resumed = " (already complete: nothing trained; --set train.epochs=N trains on)"
    if r.stopped_early:
        resumed += (f", stopped early ({config.train.early_stop_patience} epochs without a "
                    f"better one)")
    kept = r.best_cider if r.best_score is None else r.best_score
    at = f" (greedy) at epoch {r.best_epoch + 1}" if math.isfinite(kept) else ""
    click.echo(f"train {config.name}: {r.epochs} epochs, {r.steps} steps{resumed}; best val "
               f"{_kept(r.select_on, r.best_score, r.best_cider)}{at} -> {out_dir}/best.pt")


def percent(score: float) -> str:
    """A score as every printed table shows it, x100 as the papers print them (0.512 -> 51.2):
    the report's scale, for the lines of train, runs and evaluate too."""
    return f"{100 * score:.1f}"


def _kept(select_on: str, best_score: float, best_cider: float) -> str:
    """``CIDEr 51.2``, or ``BLEU-4 30.1 (CIDEr 51.2)`` when kept on another score; n/a when no
    validation scored a finite number (every epoch NaN: best.pt holds the last)."""
    if not math.isfinite(best_cider if best_score is None else best_score):
        return f"{_label(select_on)} n/a (no validation scored a finite number; best.pt holds " \
               f"the last epoch)"
    if select_on == "cider":
        return f"CIDEr {percent(best_cider)}"
    return f"{_label(select_on)} {percent(best_score)} (CIDEr {percent(best_cider)})"


def _label(select_on: str) -> str:
    """The name of the value ``train.select_on`` names (``bleu4`` -> ``BLEU-4``)."""
    from trainer.scoring.metrics import selectable

    return selectable()[select_on].label


def _echo_epoch(e) -> None:
    """``epoch 3/8  loss 2.314  val CIDEr 51.2  best 51.2 (epoch 3)  41.2 s``; kept on
    BLEU-4: ``... val CIDEr 51.2  BLEU-4 30.1  best BLEU-4 30.5 (epoch 2)  41.2 s``"""
    loss = f"{e.loss:.3f}" if e.loss is not None else "n/a"
    best_at = f"epoch {e.best_epoch}" if e.best_epoch > 0 else "start"
    label = _label(e.select_on)
    best = f"best {percent(e.best_cider)}" if e.select_on == "cider" else \
        f"{label} {percent(e.val_score)}  best {label} {percent(e.best_score)}"
    best = f"{best} ({best_at})"
    if not math.isfinite(e.best_cider if e.select_on == "cider" else e.best_score):
        best = "best n/a (no validation scored a finite number yet)" if e.select_on == "cider" \
            else f"{label} {percent(e.val_score)}  best n/a (none finite yet)"
    click.echo(f"epoch {e.epoch}/{e.epochs}  loss {loss}  val CIDEr {percent(e.val_cider)}  "
               f"{best}  {e.seconds:.1f} s")


@click.command("runs")
@click.argument("workdir", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def runs_cmd(workdir, as_json):
    """The runs under WORKDIR/runs/ (default: here), by name: decoder, objective, epochs done
    of those planned, state (running, finished, failed, stopped), best validation CIDEr and
    test CIDEr once evaluated (evals/NAME/, or the run's eval/ where older capstacks wrote),
    x100 as the report prints them (--json: as stored, 0 to 1 and beyond). A run is one row
    whatever its names; a name linking out of WORKDIR/runs/ (an experiment's view of its
    baseline's runs) is shown as the link it is."""
    from dataclasses import asdict

    from trainer.runs import list_runs

    rows = list_runs(workdir)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=2))
        return
    if not rows:
        click.echo(f"no runs under {workdir / 'runs'}")
        return

    def best(r):
        if r.best_cider is None:
            return "-"
        at = "epoch ?" if r.best_epoch is None else f"epoch {r.best_epoch}" if r.best_epoch \
            else "start"
        return f"{percent(r.best_cider)} ({at})"

    def known(value):
        return "?" if value is None else str(value)

    table = [("name", "decoder", "objective", "epochs", "state", "best val CIDEr", "test CIDEr")]
    table += [(r.name if r.link is None else f"{r.name} -> {r.link}", known(r.decoder),
               known(r.objective),
               f"{known(r.epochs_done)}/{known(r.epochs)}", known(r.state), best(r),
               "-" if r.test_cider is None else percent(r.test_cider)) for r in rows]
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    click.echo("  ".join(cell.ljust(w) for cell, w in zip(table[0], widths)).rstrip())
    for r, row in zip(rows, table[1:]):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        for note in ([f"{r.state}: {r.error}"] if r.error else []) + r.notes:
            click.echo(f"    {note}")
        if r.link is not None:
            click.echo("    not this folder's own run: a link to another's (as an experiment "
                       "links its baseline's)")
        for name in r.links:
            click.echo(f"    also named {name} (a link to this run)")


@stage_command("cider-cache", code="trainer.rewards.cider_cache")
@click.argument("prepared", type=click.Path(file_okay=False, path_type=Path))
@click.option("--split", default="train", show_default=True)
@click.option("--out", required=True, type=OutputFile())
def cider_cache_cmd(prepared, split, out):
    """Document frequencies and reference n-grams of a split, once, for CIDEr-D rewards."""
    from trainer.rewards.cider_cache import build_cache

    scorer = build_cache(prepared, split, out)
    click.echo(f"cider-cache: {len(scorer.image_ids)} images, {len(scorer.ref_lengths)} "
               f"references, {len(scorer.ngrams)} n-grams -> {out}")
