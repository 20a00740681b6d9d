"""Sweeps: the runs ``capstack run STAGE`` is asked for, handed to a launcher.

A sweep is one stage run in several experiments at once: the baseline and the experiments that
``--set`` (a value, or a grid of values: experiments.grid_of) and ``--seeds`` make
(experiments.runs_asked). Each run's own stages are the stage and, with ``--with-deps``, the
stages upstream of it that the run owns (experiments.ExperimentPipeline); the stages upstream
that the runs share (the baseline's, or a group's that its seeds share) are the sweep's shared
stages, run once, before any run.

A launcher (pipeline/engine/launchers/, one registered file each) decides where each run's
own stages run: one after another in this process (``serial``), as processes of this machine
(``jobs``), or as jobs of submitit (``local``, ``slurm``). Whatever runs a run runs the same
:class:`ExperimentJob`: ``capstack run STAGE --name NAME`` in the workdir, its output appended
to the run's log, ``<run folder>/.capstack/logs/STAGE.log``. The engine's guarantees hold as in
one run: a stage's lock keeps two processes (two jobs of a cluster, on a filesystem whose locks
every machine sees) from running it at once, a stage up to date is skipped, and a stage whose
run was interrupted resumes (its attempt record; a training from its last checkpoint).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import yaml

from pipeline.core.atomic import atomic_file
from pipeline.core.entry import capstack_command
from pipeline.core.errors import CapstackError
from pipeline.core.regular import read_text
from pipeline.core.runlock import holder_now
from pipeline.engine.experiments import (Experiment, ExperimentPipeline, pipeline_of, running_in,
                                         runs_asked, save_experiment)
from pipeline.engine.keeper import GRACE, die_with_parent
from pipeline.engine.stages import NEVER_RUN, Pipeline, StageStatus, lock_name

Report = Callable[[str], None]
LOGS = "logs"  # under a run folder's .capstack/: each stage's log of its sweep runs
JOBS = "jobs"  # under a run folder's .capstack/: the job that runs a stage there (submitit's)
BASELINE = "baseline"


@dataclass(frozen=True)
class Run:
    """One run of the sweep's stage: in ``experiment`` (None: the baseline), whose stages
    ``pipeline`` has; ``up_to_date``: its stage (and, with --with-deps, everything upstream)
    was up to date when the sweep was planned."""

    experiment: Experiment | None
    pipeline: Pipeline
    stage: str
    up_to_date: bool = False

    @property
    def label(self) -> str:
        return BASELINE if self.experiment is None else self.experiment.name

    @property
    def folder(self) -> Path:
        return self.pipeline.workdir

    @property
    def log(self) -> Path:
        return self.folder / ".capstack" / LOGS / f"{lock_name(self.stage)}.log"


@dataclass(frozen=True)
class Shared:
    """A stage upstream of the runs' that they share, not up to date: ``stage`` as ``owner``
    (the baseline, or the experiment whose seeds share it) has it."""

    owner: Pipeline
    stage: str

    @property
    def experiment(self) -> Experiment | None:
        return self.owner.experiment if isinstance(self.owner, ExperimentPipeline) else None


@dataclass(frozen=True)
class Sweep:
    """What ``capstack run STAGE`` was asked: the runs, in order, and the shared stages they
    need first (in run order). ``root``: the workdir's stages."""

    root: Pipeline
    stage: str
    runs: tuple[Run, ...]
    shared: tuple[Shared, ...]
    force: bool = False
    with_deps: bool = False

    @property
    def to_run(self) -> list[Run]:
        return [r for r in self.runs if self.force or not r.up_to_date]

    def run_argv(self, stage: str, experiment: Experiment | None, *, own: bool) -> list[str]:
        """``capstack run STAGE`` as a process runs it for ``experiment`` (its stages file and
        workdir named; ``own``: the sweep's --force and --with-deps)."""
        words = ["run", stage, "-c", str(self.root.file.path.resolve()),
                 "--workdir", str(self.root.workdir)]
        if experiment is not None:
            words += ["--name", experiment.name]
        if own and self.force:
            words.append("--force")
        if own and self.with_deps:
            words.append("--with-deps")
        if self.root.outs_outside_workdir:
            words.append("--outs-outside-workdir")
        return words

    def job(self, run: Run, env: Mapping[str, str] | None = None) -> ExperimentJob:
        """The job that runs ``run``'s own stages (``env``: variables the launcher sets)."""
        argv = tuple(self.run_argv(self.stage, run.experiment, own=True))
        return ExperimentJob(run.label, (argv,), str(self.root.workdir), str(run.log),
                             tuple((env or {}).items()))

    def shared_job(self, env: Mapping[str, str] | None = None) -> ExperimentJob | None:
        """The job that runs the shared stages, in order (None when there is none)."""
        if not self.shared:
            return None
        commands = tuple(tuple(self.run_argv(s.stage, s.experiment, own=False))
                         for s in self.shared)
        return ExperimentJob("shared stages", commands, str(self.root.workdir),
                             str(self.shared_log), tuple((env or {}).items()))

    @property
    def shared_log(self) -> Path:
        return self.root.state_dir / LOGS / f"shared.{lock_name(self.stage)}.log"

    def save(self) -> None:
        """Write the manifest of every experiment a process will run in (its group's first):
        a process finds it by its name."""
        for shared in self.shared:
            if shared.experiment is not None:
                save_experiment(shared.experiment)
        for run in self.to_run:
            if run.experiment is not None:
                save_experiment(run.experiment)

    def run_shared_here(self, report: Report) -> None:
        """The shared stages, in order, in this process."""
        for shared in self.shared:
            with running_in(shared.experiment):
                shared.owner.run_stage(shared.owner.file.stage(shared.stage), False, report)


def plan(root: Pipeline, stage: str, assignments: Iterable[str], name: str | None,
         seeds: Sequence[int] = (), *, force: bool = False, with_deps: bool = False) -> Sweep:
    """The sweep ``capstack run STAGE [--set ...] [--name NAME] [--seeds ...]`` asks for, every
    run checked before the first runs; nothing is written, no status read (a launcher that
    needs them asks :func:`with_states`)."""
    asked = runs_asked(root, stage, assignments, name, seeds)
    runs = [Run(run, root if run is None else pipeline_of(root, run), stage) for run in asked]
    for run in runs:
        if seeds and run.experiment is not None and run.experiment.name != run.experiment.group \
                and stage not in _own(run.pipeline):
            raise CapstackError(f"--seeds: experiment {run.experiment.name} does not change "
                                f"stage '{stage}' (its seed is set on "
                                f"{', '.join(run.experiment.roots)}); run the seeds on a stage "
                                f"upstream of it first")
    return Sweep(root, stage, tuple(runs), (), force, with_deps)


def with_states(sweep: Sweep) -> Sweep:
    """``sweep`` with each run's state (up to date or not) and the shared stages its runs need
    that are not up to date, read once per folder. Without --with-deps, a run that needs a
    stage upstream that is not up to date is refused, as ``Pipeline.run`` refuses it, before
    any run starts."""
    states = _States()
    runs = [Run(r.experiment, r.pipeline, r.stage, states.of(r.pipeline, r.stage).up_to_date)
            for r in sweep.runs]
    shared: dict[tuple[Path, str], Shared] = {}
    for run in runs:
        if run.up_to_date and not sweep.force:
            continue
        for up in run.pipeline.upstream_closure(sweep.stage):
            owner = _owner(run.pipeline, up)
            status = states.of(owner, up)
            if status.up_to_date:
                continue
            if not sweep.with_deps:
                raise CapstackError(
                    f"{'' if run.experiment is None else f'experiment {run.label}: '}stage "
                    f"'{sweep.stage}' needs stage '{up}', which is {status.describe()}; run "
                    f"`{run.pipeline.run_hint(up)}` first, or add --with-deps")
            if owner is not run.pipeline:
                shared.setdefault((owner.workdir, up), Shared(owner, up))
    order = {name: k for k, name in enumerate(sweep.root.file.order)}
    ordered = sorted(shared.values(), key=lambda s: (order[s.stage], str(s.owner.workdir)))
    return Sweep(sweep.root, sweep.stage, tuple(runs), tuple(ordered), sweep.force,
                 sweep.with_deps)


def _own(pipeline: Pipeline) -> frozenset[str]:
    """The stages ``pipeline`` runs in its own folder (every stage, for the baseline)."""
    if isinstance(pipeline, ExperimentPipeline):
        return pipeline.own
    return frozenset(pipeline.file.order)


def _owner(pipeline: Pipeline, stage: str) -> Pipeline:
    """The pipeline whose folder ``stage`` runs in, as ``pipeline`` has it."""
    while isinstance(pipeline, ExperimentPipeline) and stage not in pipeline.own:
        pipeline = pipeline.baseline
    return pipeline


class _States:
    """Each stage's status as the pipeline that owns it has it, read once a folder; a folder
    not made yet (an experiment that never ran) is never made by a look: its stages never ran."""

    def __init__(self) -> None:
        self._seen: dict[Path, dict[str, StageStatus]] = {}

    def of(self, pipeline: Pipeline, stage: str) -> StageStatus:
        if isinstance(pipeline, ExperimentPipeline) and not pipeline.workdir.is_dir():
            return StageStatus(stage, NEVER_RUN)
        if pipeline.workdir not in self._seen:
            self._seen[pipeline.workdir] = pipeline.statuses()
        return self._seen[pipeline.workdir][stage]


# -- what a process runs -----------------------------------------------------------------------
_RUNNING: list[subprocess.Popen] = []  # the command an ExperimentJob runs now, in its process


@dataclass(frozen=True)
class ExperimentJob:
    """capstack commands run in order in one process (``commands``: each the words after
    ``capstack``; an experiment's own stages are one ``capstack run STAGE --name NAME``), each
    as a child in a process group of its own, its output appended to ``log``. ``env``: the
    variables the launcher sets (threads, a GPU). Picklable, so that submitit runs it on a
    cluster's node; the jobs launcher starts its one command itself (:meth:`start`).

    Stopped (SIGTERM, Ctrl-C, submitit's timeout signal) it stops its command as ``capstack
    run`` is stopped, a training at a batch boundary, and waits for it: the same job again
    resumes it. As a submitit job it is checkpointable: at a cluster's time limit or a
    preemption it is requeued, and resumes."""

    label: str
    commands: tuple[tuple[str, ...], ...]
    cwd: str
    log: str
    env: tuple[tuple[str, str], ...] = field(default=())

    def environment(self) -> dict[str, str]:
        """The command's variables: this process's, the launcher's, and unbuffered output, so
        that its log can be followed as it runs (``tail -f``)."""
        return {**os.environ, "PYTHONUNBUFFERED": "1", **dict(self.env)}

    def start(self, argv: Sequence[str]) -> subprocess.Popen:
        """``capstack ARGV`` started in a process group of its own, ending should this process
        die, its output appended to the log under a line saying when, where and what."""
        log = Path(self.log)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"== {time.strftime('%Y-%m-%dT%H:%M:%S')} on {socket.gethostname()}: "
                      f"capstack {shlex.join(argv)}\n")
            out.flush()
            return subprocess.Popen(capstack_command(argv), cwd=self.cwd,
                                    env=self.environment(), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=_own_group)

    def __call__(self) -> str:
        """Run the commands in order; a CapstackError naming the log at the first that fails."""
        for argv in self.commands:
            child = self.start(argv)
            _RUNNING.append(child)
            try:
                rc = child.wait()
            except BaseException:
                stop([child])
                raise
            finally:
                _RUNNING.remove(child)
            if rc != 0:
                raise CapstackError(f"{self.label}: `capstack {shlex.join(argv)}` "
                                    f"{ended(rc)}: {last_error(Path(self.log))} (log: {self.log})")
        return self.log

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook at a time limit or a preemption: stop the command (its stage
        resumes when run again), and requeue this same job."""
        import submitit  # in a submitit job: installed

        stop(list(_RUNNING))
        return submitit.helpers.DelayedSubmission(self)


def _own_group() -> None:
    os.setpgid(0, 0)
    die_with_parent()


def stop(children: Iterable[subprocess.Popen], grace: float = GRACE + 15) -> None:
    """Ask each child's process group to stop (SIGTERM: ``capstack run`` stops its stage, a
    training at a batch boundary, and records nothing), and wait until each has ended; one
    that outlives ``grace`` seconds, or a second stop asked of this process, is killed."""
    children = [c for c in children if c.poll() is None]
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            child.wait()
        except BaseException:  # asked again: at once
            for other in children:
                _signal_group(other, signal.SIGKILL)
            raise


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)


def typed(path: str | os.PathLike) -> str:
    """``path`` as a user here types it: relative to the current folder when inside it."""
    path = Path(path)
    here = Path.cwd()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def ended(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"was stopped by signal {signal.Signals(-rc).name}"
        return f"was stopped by signal {-rc}"
    return f"exited with status {rc}"


def last_error(log: Path) -> str:
    """What a failed run said last: the last line of its log that reads as an error, else its
    last line."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines()
                     if line.strip()]
    except OSError:
        return "no log"
    errors = [line.removeprefix("Error:").strip() for line in lines if line.startswith("Error:")]
    return (errors or lines or ["nothing said"])[-1]


# -- what a sweep did --------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a launcher did with a sweep's runs, by label."""

    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # label, why, log
    skipped: list[str] = field(default_factory=list)  # up to date
    submitted: list[tuple[str, str]] = field(default_factory=list)  # label, job id
    queued: list[tuple[str, str]] = field(default_factory=list)  # submitted before, not ended
    stopped: list[str] = field(default_factory=list)  # stopped half way: they resume
    not_started: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{len(self.done)} done", f"{len(self.failed)} failed",
                 f"{len(self.skipped)} skipped (up to date)"]
        if self.submitted or self.queued:
            parts[:0] = [f"{len(self.submitted)} submitted"] + \
                ([f"{len(self.queued)} queued before"] if self.queued else [])
        if self.stopped or self.not_started:
            parts += [f"{len(self.stopped)} stopped", f"{len(self.not_started)} not started"]
        return "sweep: " + ", ".join(parts)

    def failures(self) -> list[str]:
        return [f"{label}: {why} (log: {log})" for label, why, log in self.failed]

    def rerun(self) -> str:
        """What the same command again does, after a stop."""
        said = [f"skips the {len(self.done) + len(self.skipped)} done"] \
            if self.done or self.skipped else []
        if self.stopped:
            said.append(f"resumes the {len(self.stopped)} stopped ({', '.join(self.stopped)}) "
                        f"where they stopped (a training from its last checkpoint)")
        if self.failed:
            said.append(f"runs the {len(self.failed)} failed again")
        if self.not_started:
            said.append(f"starts the {len(self.not_started)} not started")
        return "the same command again " + "; ".join(said or ["runs them all"])


# -- the job that runs a stage in a folder, as a launcher submitted it -------------------------
def record_job(run_folder: Path, stage: str, record: Mapping[str, Any]) -> None:
    """Note the job that runs ``stage`` in ``run_folder`` (``exp list`` says its state)."""
    path = run_folder / ".capstack" / JOBS / f"{lock_name(stage)}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:
        tmp.write_text(yaml.safe_dump(dict(record), sort_keys=False))


def job_records(run_folder: Path) -> Iterator[dict[str, Any]]:
    """The jobs noted in ``run_folder``, by stage (a damaged record is none)."""
    folder = run_folder / ".capstack" / JOBS
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, CapstackError, UnicodeDecodeError, yaml.YAMLError):
            record = yaml.safe_load(read_text(path, "a job record"))
            if isinstance(record, dict) and {"launcher", "job_id", "stage"} <= set(record):
                yield record


def wait_unlocked(runs: Iterable[Run], timeout: float = GRACE + 15) -> list[str]:
    """Wait until no process holds the run lock of a run's stage (a stopped job's command
    still stopping); the labels of those still held after ``timeout`` seconds."""
    from pipeline.engine.experiments import run_lock

    deadline = time.monotonic() + timeout
    runs = list(runs)
    while True:
        held = [r.label for r in runs if holder_now(run_lock(r.pipeline, r.stage))]
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.2)
