"""Training curves from a run's metrics.jsonl: loss by step, validation CIDEr by epoch, and an
RL run drawn after the XE run it started from, on one time axis.

A log with discriminator rounds (kind "discriminator", HACap) gets a third panel: D's
held-out accuracy by step (chance, 0.5, dashed) beside the validation CIDEr, each
validation placed at the last step of its epoch. Epochs and CIDEr read as the printed lines
say them: the third epoch is 3 (0 the start checkpoint), CIDEr x100."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline.core.errors import CapstackError, not_utf8
from pipeline.core.regular import read_text
from trainer.evaluation.figures.render import save_png

MOVING_AVERAGE_WINDOW = 20
CHANCE = 0.5  # a discriminator that cannot tell references from samples
SCALE = 100  # CIDEr drawn x100, as every printed table and line shows it


def shown_epoch(logged: int) -> int:
    """An epoch as the printed lines count it: the log's 0-based epoch 2 is the third, 3; the
    start checkpoint's (-1) is 0."""
    return logged + 1


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_metrics(path: Path) -> list[dict]:
    """Parse the JSON-lines log, naming the file and line of anything malformed."""
    try:
        text = read_text(path, "a training log")
    except FileNotFoundError:
        raise CapstackError(f"{path}: metrics file not found") from None
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from None
    except OSError as e:
        raise CapstackError(f"{path}: cannot read metrics file ({e.strerror})") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CapstackError(f"{path}: line {number}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise CapstackError(f"{path}: line {number}: expected a JSON object")
        _check_record(record, path, number)
        records.append(record)
    return records


def _check_record(record: dict, path: Path, number: int) -> None:
    kind: Any = record.get("kind")  # any JSON value
    required = {"train": ("epoch", "step", "loss"), "val": ("epoch", "cider"),
                "discriminator": ("step",)}.get(kind, ())
    if kind is None:
        raise CapstackError(f"{path}: line {number}: missing 'kind'")
    for key in required:
        if not _is_number(record.get(key)):
            raise CapstackError(f"{path}: line {number}: {kind} line needs a numeric {key!r}")


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` points (fewer at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def _plot_train(ax: Axes, train: list[dict], color: str = "tab:blue", label: str = "loss") -> None:
    train = sorted(train, key=lambda r: r["step"])
    steps = np.array([r["step"] for r in train], dtype=np.float64)
    losses = np.array([r["loss"] for r in train], dtype=np.float64)
    ax.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8, label=label)
    window = min(MOVING_AVERAGE_WINDOW, losses.size)
    ax.plot(steps, _moving_average(losses, window), color=color, linewidth=1.6,
            label=f"moving average ({window})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss" if label == "loss" else label, color=color)
    ax.legend(loc="upper right" if label == "loss" else "center right")


def _plot_val(ax: Axes, val: list[dict], color: str = "tab:orange", label: str | None = None
              ) -> None:
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation CIDEr")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not val:
        ax.text(0.5, 0.5, "no validation yet", ha="center", va="center", transform=ax.transAxes)
        return
    val = sorted(val, key=lambda r: r["epoch"])
    ax.plot([shown_epoch(r["epoch"]) for r in val], [SCALE * r["cider"] for r in val], "o-",
            color=color, label=label)


def _val_steps(train: list[dict], val: list[dict]) -> list[tuple[float, float]]:
    """(step, CIDEr) of each validation of one phase: the last logged step of its epoch (the
    trainer logs every epoch's last batch), 0 for the start checkpoint's (epoch -1)."""
    return sorted((max((t["step"] for t in train if t["epoch"] <= v["epoch"]), default=0),
                   SCALE * v["cider"]) for v in val)


def _plot_discriminator(ax: Axes, rounds: list[dict], val_steps: list[tuple[float, float]],
                        boundary: float | None = None) -> None:
    """D's held-out accuracy by step (pre-training rounds as crosses), chance dashed, and the
    validation CIDEr at its steps on the right scale."""
    rounds = sorted(rounds, key=lambda r: (r["step"], r.get("round", 0)))
    pretrain = [r for r in rounds if r.get("phase") == "pretrain"]
    adversarial = [r for r in rounds if r.get("phase") != "pretrain"]
    if pretrain:
        ax.plot([r["step"] for r in pretrain], [r["heldout_accuracy"] for r in pretrain], "x",
                color="tab:red", label="D held-out accuracy (pre-training)")
    if adversarial:
        ax.plot([r["step"] for r in adversarial], [r["heldout_accuracy"] for r in adversarial],
                ".-", color="tab:red", label="D held-out accuracy")
    ax.axhline(CHANCE, color="gray", linestyle="--", linewidth=1, label="chance")
    if boundary is not None:
        ax.axvline(boundary, color="gray", linestyle=":", linewidth=1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("discriminator held-out accuracy", color="tab:red")
    handles, labels = ax.get_legend_handles_labels()
    if val_steps:
        cider_ax = ax.twinx()
        cider_ax.plot(*zip(*val_steps), "o-", color="tab:orange", label="validation CIDEr")
        cider_ax.set_ylabel("validation CIDEr", color="tab:orange")
        ax.set_zorder(cider_ax.get_zorder() + 1)  # D's points over the CIDEr line
        ax.patch.set_visible(False)
        more = cider_ax.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="lower right", fontsize="small")


def curves_figure(metrics_jsonl: Path, before: Path | None = None,
                  labels: tuple[str, str] = ("XE", "RL")) -> Figure:
    """The figure :func:`training_curves` saves: loss by step, validation CIDEr by epoch, and,
    when either log has discriminator rounds with a held-out accuracy, D's panel on the loss
    panel's step axis. ``labels``: the two phases' names (the start's, this run's)."""
    now = _phase(Path(metrics_jsonl))
    first = _phase(Path(before)) if before is not None else None
    with_d = bool(now[2] or (first and first[2]))
    fig = Figure(figsize=(15, 4) if with_d else (10, 4), layout="constrained")
    axes = fig.subplots(1, 3 if with_d else 2)
    loss_ax, cider_ax = axes[:2]
    if first is None:
        _plot_train(loss_ax, now[0])
        _plot_val(cider_ax, now[1])
        rounds, val_steps, boundary = now[2], _val_steps(now[0], now[1]), None
    else:
        xe, rl = on_one_axis(first, now)
        _plot_train(loss_ax, xe[0])
        _plot_train(loss_ax.twinx(), rl[0], color="tab:green", label=f"{labels[1]} loss")
        loss_ax.axvline(rl[0][0]["step"] - 1, color="gray", linestyle="--", linewidth=1)
        _plot_val(cider_ax, xe[1], label=labels[0])
        _plot_val(cider_ax, rl[1], color="tab:green", label=labels[1])
        if rl[1]:
            cider_ax.axvline(shown_epoch(rl[1][0]["epoch"]), color="gray", linestyle="--",
                             linewidth=1)
        cider_ax.legend(loc="lower right")
        steps = max(r["step"] for r in first[0])  # what on_one_axis shifted the second by
        rounds, boundary = xe[2] + rl[2], steps
        val_steps = _val_steps(first[0], first[1]) + [
            (s + steps, c) for s, c in _val_steps(now[0], now[1])]
    if with_d:
        axes[2].sharex(loss_ax)
        _plot_discriminator(axes[2], rounds, val_steps, boundary)
    return fig


def training_curves(metrics_jsonl: Path, out: Path, before: Path | None = None,
                    labels: tuple[str, str] = ("XE", "RL")) -> Path:
    """Plot training loss by step and validation CIDEr by epoch from a metrics log.

    ``before``: the log of the run this one started from (XE before RL); both
    phases are drawn on one time axis, the second's loss on its own scale (right),
    named by ``labels`` (the tables' Training names: XE, SCST, Adv, ...).
    Discriminator rounds in either log add D's held-out accuracy (:func:`curves_figure`).
    """
    return save_png(curves_figure(metrics_jsonl, before, labels), Path(out))


def on_one_axis(first: tuple[list, ...], then: tuple[list, ...]):
    """(train, val[, discriminator rounds]) lines of two phases, the second's steps and epochs
    shifted past the first's.

    The RL run logs its starting point as epoch -1 (the XE checkpoint it started
    from); shifted, it sits on the last XE epoch, so the RL curve starts there.
    Lists after val (discriminator rounds) are placed by step, shifted as train's.
    """
    steps = max(r["step"] for r in first[0])
    epochs = 1 + max((r["epoch"] for r in first[1]), default=-1)
    train = [{**r, "step": r["step"] + steps} for r in then[0]]
    val = [{**r, "epoch": r["epoch"] + epochs} for r in sorted(then[1], key=lambda r: r["epoch"])]
    by_step = tuple([{**r, "step": r["step"] + steps} for r in part] for part in then[2:])
    return first, (train, val, *by_step)


def _has_accuracy(record: dict) -> bool:
    """A discriminator round that scored held-out images (none when heldout_images is 0)."""
    value = record.get("heldout_accuracy")
    return _is_number(value) and math.isfinite(value)


def _phase(metrics_jsonl: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(train, val, discriminator rounds with a held-out accuracy) lines of one log."""
    records = _read_metrics(metrics_jsonl)
    train = [r for r in records if r["kind"] == "train"]
    if not train:
        raise CapstackError(f"{metrics_jsonl}: no training lines (kind 'train') to plot")
    return (train, [r for r in records if r["kind"] == "val"],
            [r for r in records if r["kind"] == "discriminator" and _has_accuracy(r)])
