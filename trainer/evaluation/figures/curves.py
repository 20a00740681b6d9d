"""Training curves from a run's metrics.jsonl: loss by step, validation CIDEr by epoch, and an
RL run drawn after the XE run it started from, on one time axis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline.core.errors import CapstackError
from trainer.evaluation.figures.render import save_png

MOVING_AVERAGE_WINDOW = 20


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_metrics(path: Path) -> list[dict]:
    """Parse the JSON-lines log, naming the file and line of anything malformed."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CapstackError(f"{path}: metrics file not found") from None
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
    kind = record.get("kind")
    required = {"train": ("epoch", "step", "loss"), "val": ("epoch", "cider")}.get(kind, ())
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
    ax.plot([r["epoch"] for r in val], [r["cider"] for r in val], "o-", color=color, label=label)


def training_curves(metrics_jsonl: Path, out: Path, before: Path | None = None) -> Path:
    """Plot training loss by step and validation CIDEr by epoch from a metrics log.

    ``before``: the log of the run this one started from (XE before RL); both
    phases are drawn on one time axis, the RL loss on its own scale (right).
    """
    metrics_jsonl = Path(metrics_jsonl)
    train, val = _phase(metrics_jsonl)
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, cider_ax = fig.subplots(1, 2)
    if before is None:
        _plot_train(loss_ax, train)
        _plot_val(cider_ax, val)
        return save_png(fig, Path(out))
    xe, rl = on_one_axis(_phase(Path(before)), (train, val))
    _plot_train(loss_ax, xe[0])
    _plot_train(loss_ax.twinx(), rl[0], color="tab:green", label="RL loss")
    loss_ax.axvline(rl[0][0]["step"] - 1, color="gray", linestyle="--", linewidth=1)
    _plot_val(cider_ax, xe[1], label="XE")
    _plot_val(cider_ax, rl[1], color="tab:green", label="RL")
    if rl[1]:
        cider_ax.axvline(rl[1][0]["epoch"], color="gray", linestyle="--", linewidth=1)
    cider_ax.legend(loc="lower right")
    return save_png(fig, Path(out))


def on_one_axis(first: tuple[list, list], then: tuple[list, list]):
    """(train, val) lines of two phases, the second's steps and epochs shifted past the first's.

    The RL run logs its starting point as epoch -1 (the XE checkpoint it started
    from); shifted, it sits on the last XE epoch, so the RL curve starts there.
    """
    steps = max(r["step"] for r in first[0])
    epochs = 1 + max((r["epoch"] for r in first[1]), default=-1)
    train = [{**r, "step": r["step"] + steps} for r in then[0]]
    val = [{**r, "epoch": r["epoch"] + epochs} for r in sorted(then[1], key=lambda r: r["epoch"])]
    return first, (train, val)


def _phase(metrics_jsonl: Path) -> tuple[list[dict], list[dict]]:
    records = _read_metrics(metrics_jsonl)
    train = [r for r in records if r["kind"] == "train"]
    if not train:
        raise CapstackError(f"{metrics_jsonl}: no training lines (kind 'train') to plot")
    return train, [r for r in records if r["kind"] == "val"]
