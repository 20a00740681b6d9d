"""A run folder's record of itself, and the runs a workdir holds (``capstack runs``).

Training (rank 0) keeps ``state.json`` in its run folder, written atomically: ``running``
with the epochs done and the best validation CIDEr, rewritten after every epoch, then how
the training ended: ``finished``, ``failed`` (with the error) or ``stopped`` (Ctrl-C,
SIGTERM). A run is running while its ``<run>.lock`` is held (pipeline/core/runlock.py);
a record that says running with the lock free is a training killed without a word
(SIGKILL, the out-of-memory killer, a power cut), listed as stopped and said so.

Epochs here count as a user reads them: ``best_epoch`` 3 is the third epoch, 0 the
checkpoint an RL run started from (``train.init_from``). This module imports no torch, so
listing runs is quick.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json, write_json
from pipeline.core.regular import read_text
from pipeline.core.runlock import lock_beside

STATE_FILE = "state.json"
MARKER = "capstack-run"  # state.json's "capstack" value: what makes a folder a run
STATES = ("running", "finished", "failed", "stopped")
RUNS, EVALS = "runs", "evals"  # a workdir's run folders, and their evaluations (same names)


class Stopped(BaseException):
    """The command was stopped from outside (SIGTERM): a training it ends is recorded as
    stopped, not failed. Like ``KeyboardInterrupt`` it is no ``Exception``: a reader that
    takes a bad file for a note (``capstack runs``), a metric that must not end a run, an
    image skipped for any error, none of them catches it and carries on."""


def ended_as(error: BaseException) -> str:
    return "stopped" if isinstance(error, (Stopped, KeyboardInterrupt)) else "failed"


class RunRecord:
    """``state.json`` of one run folder, written by the main process only. Nothing is written
    before :meth:`begin`: a training refused before it starts (another config, a bad file)
    leaves the record of the run that is there as it was."""

    def __init__(self, out_dir: Path, main: bool):
        self.path, self.main = Path(out_dir) / STATE_FILE, main
        self.fields: dict | None = None

    def begin(self, *, epochs: int, epochs_done: int, steps: int, best_cider: float,
              best_epoch: int) -> None:
        self.fields = {"capstack": MARKER, "pid": os.getpid(), "started": time.time()}
        self.update(epochs=epochs, epochs_done=epochs_done, steps=steps, best_cider=best_cider,
                    best_epoch=best_epoch)

    def update(self, *, epochs: int, epochs_done: int, steps: int, best_cider: float,
               best_epoch: int) -> None:
        """After an epoch: ``best_epoch`` 0-based as the loop counts (-1: the start)."""
        found = math.isfinite(best_cider)
        assert self.fields is not None, "begin() comes first"
        self.fields.update(epochs=epochs, epochs_done=epochs_done, steps=steps,
                           best_cider=best_cider if found else None,
                           best_epoch=best_epoch + 1 if found else None)
        self.write("running")

    def end(self, error: BaseException | None = None) -> None:
        """How the training ended; an error that also stops the record's writing (a full
        disk) is left to the one being raised."""
        if self.fields is None:
            return
        if error is None:
            self.write("finished")
            return
        with contextlib.suppress(OSError, CapstackError):
            self.write(ended_as(error), error=str(error) or type(error).__name__)

    def write(self, state: str, **extra) -> None:
        assert self.fields is not None, "begin() comes first"
        if self.main:
            write_json(self.path, {**self.fields, "state": state, "updated": time.time(),
                                   **extra})


# ----------------------------------------------------------------------- listing runs

@dataclass
class RunRow:
    """One run as ``capstack runs`` shows it; None where the folder does not say."""

    name: str
    path: str
    decoder: str | None = None
    objective: str | None = None
    epochs_done: int | None = None
    epochs: int | None = None
    state: str | None = None
    best_cider: float | None = None
    best_epoch: int | None = None  # 1-based; 0: the starting checkpoint
    test_cider: float | None = None
    evaluated: str | None = None  # the metrics.json test_cider comes from
    error: str | None = None  # a failed run's error
    notes: list[str] = field(default_factory=list)  # what is damaged, stale or unknown
    link: str | None = None  # where the name leads when the run is another folder's
    links: list[str] = field(default_factory=list)  # the run's other names here (links to it)


def list_runs(workdir: str | Path) -> list[RunRow]:
    """The runs in ``workdir/runs/*/``, by name. A folder with no run record, no config and
    no held lock is no run, and is left out.

    A run is one row whatever its names: a second name of it (a symbolic link to it) is one
    of its ``links``. A name that leads out of ``workdir/runs/`` (an experiment's
    ``exps/NAME/runs/`` shows the baseline's runs through relative links) is another
    folder's run: listed with the ``link``, never as this workdir's own."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise CapstackError(f"{workdir}: not a folder")
    runs_dir = workdir / RUNS
    if not runs_dir.is_dir():
        return []
    folders = [folder for folder in sorted(runs_dir.iterdir())
               if folder.is_dir() and not folder.name.startswith(".")]
    own_place = workdir.resolve() / RUNS
    real = {folder: folder.resolve() for folder in folders}
    own = {folder for folder in folders if real[folder] == own_place / folder.name}
    rows: dict[Path, RunRow | None] = {}  # by the folder the names lead to
    for folder in sorted(folders, key=lambda f: f not in own):  # its own name first
        if real[folder] in rows:
            row = rows[real[folder]]
            if row is not None:
                row.links.append(folder.name)
            continue
        row = rows[real[folder]] = read_run(folder, workdir)
        if row is not None and folder not in own:
            row.link = os.readlink(folder) if folder.is_symlink() else str(real[folder])
    return sorted((row for row in rows.values() if row is not None), key=lambda r: r.name)


def read_run(folder: Path, workdir: Path) -> RunRow | None:
    held = lock_held(folder)
    if not held and not (folder / STATE_FILE).exists() and not (folder / "config.json").exists():
        return None
    row = RunRow(folder.name, str(folder))
    read_config(folder / "config.json", row)
    if (folder / STATE_FILE).exists():
        read_state(folder / STATE_FILE, row)
    else:
        read_older_run(folder, row)
    if held:
        row.state, row.error = "running", None  # resumed: how it ended before is past
    elif row.state == "running":
        row.state = "stopped"
        row.notes.append("ended without recording how (killed: SIGKILL, out of memory, power?); "
                         "the same train command resumes it")
    read_test_cider(folder, workdir, row)
    return row


def lock_held(folder: Path) -> bool:
    """Whether a training holds ``<folder>.lock``: a shared lock is refused while it does.
    The lock file is emptied when released, so an empty one is not even tried."""
    lock = lock_beside(folder)
    try:
        if lock.stat().st_size == 0:
            return False
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the shared lock if it was taken
    return False


def read_json_for(path: Path, row: RunRow, what: str) -> dict | None:
    """A json object from ``path``, or None with a note naming what is wrong with it."""
    try:
        value = read_json(path, what)
    except CapstackError as error:
        row.notes.append(str(error))
        return None
    if not isinstance(value, dict):
        row.notes.append(f"{path}: expected a JSON object, got {type(value).__name__}")
        return None
    return value


def pick(data: dict, keys: str, kind, path: Path, row: RunRow):
    """``data[a][b]`` for ``keys`` "a.b" when it has ``kind``; else None and a note."""
    value: Any = data
    for key in keys.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    kinds = (kind,) if isinstance(kind, type) else kind
    if value is None or not isinstance(value, kinds) or isinstance(value, bool):
        row.notes.append(f"{path}: {keys}: expected {kinds[0].__name__}, got {value!r}")
        return None
    return value


def read_config(path: Path, row: RunRow) -> None:
    if not path.exists():
        row.notes.append(f"{path}: not found (the run has not started training)")
        return
    config = read_json_for(path, row, "run config")
    if config is not None:
        row.decoder = pick(config, "decoder.name", str, path, row)
        row.objective = pick(config, "objective.name", str, path, row)
        row.epochs = pick(config, "train.epochs", int, path, row)


def read_state(path: Path, row: RunRow) -> None:
    state = read_json_for(path, row, "run record")
    if state is None:
        return
    if state.get("capstack") != MARKER or state.get("state") not in STATES:
        row.notes.append(f"{path}: not a capstack run record (state {state.get('state')!r})")
        return
    row.state = state["state"]
    row.epochs = pick(state, "epochs", int, path, row)
    row.epochs_done = pick(state, "epochs_done", int, path, row)
    if state.get("best_cider") is not None:
        row.best_cider = finite_score(state, "best_cider", path, row)
        row.best_epoch = epoch_number(state, "best_epoch", 0, path, row)
    if row.state in ("failed", "stopped"):
        row.error = state.get("error")


def read_older_run(folder: Path, row: RunRow) -> None:
    """A run trained before runs kept ``state.json``: its ``summary.json`` (written when it
    finished; those capstacks counted its ``best_epoch`` from 0, -1 the start, where
    ``summary.json`` now counts as ``state.json`` does) or the validations of its
    ``metrics.jsonl``."""
    summary_path = folder / "summary.json"
    if summary_path.exists():
        summary = read_json_for(summary_path, row, "run summary")
        if summary is not None:
            row.epochs_done = pick(summary, "epochs", int, summary_path, row)
            if summary.get("best_cider") is not None:
                row.best_cider = finite_score(summary, "best_cider", summary_path, row)
                best_epoch = epoch_number(summary, "best_epoch", -1, summary_path, row)
                row.best_epoch = None if best_epoch is None else best_epoch + 1
            done, planned = row.epochs_done, row.epochs
            row.state = "finished" if done is not None and (planned is None or done >= planned) \
                else "stopped"
            return
    if not (folder / "metrics.jsonl").exists():
        return  # no training to read: what is there (a config) said what it could
    vals = validations(folder / "metrics.jsonl", row)
    row.epochs_done = len({epoch for epoch, _ in vals if epoch >= 0})
    scored = [(cider, -epoch) for epoch, cider in vals if math.isfinite(cider)]
    if scored:  # a NaN validation is never the best; of equal scores the first
        cider, epoch = max(scored)
        row.best_cider, row.best_epoch = cider, 1 - epoch
    row.state = "stopped"
    row.notes.append("no end state recorded (trained by a capstack that kept none)")


def validations(path: Path, row: RunRow) -> list[tuple[int, float]]:
    """(epoch, CIDEr) of each validation in a training log; a bad line is noted, not fatal."""
    import json

    try:
        lines = read_text(path, "a training log").splitlines()
    except FileNotFoundError:
        return []
    except CapstackError as error:  # not a regular file: never read
        row.notes.append(str(error))
        return []
    except (OSError, UnicodeDecodeError) as error:
        row.notes.append(f"{path}: cannot read ({error})")
        return []
    found = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            row.notes.append(f"{path}: line {number} is not a log entry")
            break
        if entry.get("kind") != "val":
            continue
        epoch, cider = entry.get("epoch"), entry.get("cider")
        if not is_int(epoch) or epoch < -1 or not is_number(cider):
            row.notes.append(f"{path}: line {number}: a validation of epoch {epoch!r} scored "
                             f"{cider!r} (expected an epoch from -1 and a number)")
            break
        found.append((epoch, float(cider)))
    return found


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite_score(data: dict, key: str, path: Path, row: RunRow) -> float | None:
    """``data[key]`` when a finite number; else None and a note (a NaN is no best score)."""
    value = data.get(key)
    if is_number(value) and math.isfinite(value):
        return value
    row.notes.append(f"{path}: {key}: expected a finite number, got {value!r}")
    return None


def epoch_number(data: dict, key: str, first: int, path: Path, row: RunRow) -> int | None:
    """``data[key]`` when a whole number from ``first``; else None and a note."""
    value = data.get(key)
    if is_int(value) and value >= first:
        return value
    row.notes.append(f"{path}: {key}: expected an epoch number from {first}, got {value!r}")
    return None


def evaluation_folder(target: Path) -> Path:
    """Where ``capstack evaluate RUN`` writes unless ``--out`` says: ``evals/NAME`` beside the
    ``runs/`` folder that holds the run, as the stages write it (``runs/top_down`` ->
    ``evals/top_down``, ``coco/runs/stack_cap/show_tell`` -> ``coco/evals/stack_cap/show_tell``);
    a run in no ``runs/`` folder gets ``evals/NAME`` beside it. ``target`` is a run folder or a
    checkpoint in one."""
    run = target.parent if target.is_file() else target
    if not run.name:
        run = run.resolve()
    parents = run.parts[:-1]
    if RUNS not in parents:
        return run.parent / EVALS / run.name
    at = len(parents) - 1 - parents[::-1].index(RUNS)  # the runs/ folder nearest the run
    return Path(*run.parts[:at], EVALS, *run.parts[at + 1:])


def read_test_cider(folder: Path, workdir: Path, row: RunRow) -> None:
    """The CIDEr of ``capstack evaluate``: ``evals/<name>/`` beside ``runs/`` (the stages' place
    and evaluate's), else ``<run>/eval/`` (where evaluate wrote by default before)."""
    path = next((p for p in (evaluation_folder(folder) / "metrics.json",
                             folder / "eval" / "metrics.json") if p.exists()), None)
    if path is None:
        return
    metrics = read_json_for(path, row, "evaluation")
    if metrics is None:
        return
    cider = pick(metrics, "metrics.CIDEr", (float, int), path, row)
    if cider is None:
        return
    if metrics.get("split", "test") != "test":
        row.notes.append(f"{path}: evaluated on the {metrics.get('split')} split, not test")
        return
    row.test_cider, row.evaluated = cider, str(path)
    best = folder / "best.pt"
    with contextlib.suppress(OSError):
        if best.stat().st_mtime > path.stat().st_mtime:
            row.notes.append(f"{path}: older than {best} (trained on since): evaluate again")
