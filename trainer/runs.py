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

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.core.runlock import lock_beside
from trainer import upgrade
from trainer.run_fields import epoch_number, finite_score, pick, read_json_for

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
    else:  # a run trained before runs kept a record: what it left, read as one
        for key, value in upgrade.older_run(folder, row.epochs, row.notes).items():
            setattr(row, key, value)
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


def read_config(path: Path, row: RunRow) -> None:
    if not path.exists():
        row.notes.append(f"{path}: not found (the run has not started training)")
        return
    config = read_json_for(path, row.notes, "run config")
    if config is not None:
        row.decoder = pick(config, "decoder.name", str, path, row.notes)
        row.objective = pick(config, "objective.name", str, path, row.notes)
        row.epochs = pick(config, "train.epochs", int, path, row.notes)


def read_state(path: Path, row: RunRow) -> None:
    state = read_json_for(path, row.notes, "run record")
    if state is None:
        return
    if state.get("capstack") != MARKER or state.get("state") not in STATES:
        row.notes.append(f"{path}: not a capstack run record (state {state.get('state')!r})")
        return
    row.state = state["state"]
    row.epochs = pick(state, "epochs", int, path, row.notes)
    row.epochs_done = pick(state, "epochs_done", int, path, row.notes)
    if state.get("best_cider") is not None:
        row.best_cider = finite_score(state, "best_cider", path, row.notes)
        row.best_epoch = epoch_number(state, "best_epoch", 0, path, row.notes)
    if row.state in ("failed", "stopped"):
        row.error = state.get("error")


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
                             *upgrade.older_evaluations(folder)) if p.exists()), None)
    if path is None:
        return
    metrics = read_json_for(path, row.notes, "evaluation")
    if metrics is None:
        return
    cider = pick(metrics, "metrics.CIDEr", (float, int), path, row.notes)
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
