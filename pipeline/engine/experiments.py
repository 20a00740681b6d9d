"""Named experiments: variants of stages kept beside the baseline's, as ``dvc exp run -S``.

An experiment is a name, the params it sets, and the stages it was asked to run with them (its
roots). Its settings apply to each root and to every stage downstream of a root that has a
param of that name (a seed set on ``train@top_down`` is also ``rl@top_down``'s seed; the
dataset's own ``seed`` upstream stays the baseline's). A stage whose params the settings change,
and every stage downstream of one, is the experiment's own: it runs in the experiment's folder,
``exps/NAME/`` under the workdir, with a lock file of its own, and writes its outs there. Every
other stage is the baseline's, shared: it runs (when needed) in the workdir, and the
experiment's folder shows the workdir's files through relative symbolic links, made again
before each own stage runs, so an experiment's commands read the baseline's prepared captions,
checkpoints and feature pointers where it changed nothing, and never write into them. Feature
stores stay shared by fingerprint: an extraction with other params writes a store of another
name, never over one.

A param of an own stage holding a relative path that leaves the workdir (``../x.yaml``) is
made absolute from the workdir, so it names the baseline's file. An own stage's cmd is given
the experiment's group as ``${experiment}`` (interpolation.with_given); a shared one the
baseline's "". The manifest, the name and the folder are manifests.py's; what ``capstack run``
asks (a grid, seeds) planning.py's; both are imported here by their old names too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pipeline.core.errors import CapstackError
from pipeline.engine.manifests import (EXPERIMENTS, MANIFEST, Experiment, NoSuchExperiment,
                                       UnusableExperiment, auto_name, check_name, experiments,
                                       folder_of, open_experiment, read_experiment,
                                       remove_experiments, run_locks, running_in,
                                       save_experiment, settings_differences)
from pipeline.engine.planning import (MAX_RUNS, MAX_SEED, MAX_SEEDS, grid_of, parse_seeds,
                                      runs_asked)
from pipeline.engine.stagefile import Stage, StagesFile
from pipeline.engine.stages import Pipeline, StageStatus, same_value

__all__ = ["EXPERIMENTS", "MANIFEST", "MAX_RUNS", "MAX_SEED", "MAX_SEEDS", "Experiment",
           "ExperimentPipeline", "NoSuchExperiment", "UnusableExperiment", "auto_name",
           "changed_stages", "check_name", "experiments", "folder_of", "grid_of", "mirror",
           "open_experiment", "parse_seeds", "pipeline_of", "pipelines_listed",
           "read_experiment", "remove_experiments", "run_lock", "run_locks", "running_in",
           "runs_asked", "save_experiment", "settings_differences"]

log = logging.getLogger(__name__)

_STATE = {".capstack", MANIFEST}  # an experiment's own bookkeeping, never a link


# -- the experiment's stages ----------------------------------------------------------------
def changed_stages(file: StagesFile, experiment: Experiment) -> dict[str, Stage]:
    """The stages whose params the experiment's settings change, resolved with them: each
    root and each stage downstream of one that has a param of a set name."""
    missing = [r for r in experiment.roots if r not in file.stages]
    if missing:
        raise CapstackError(f"experiment '{experiment.name}' ({experiment.folder}): its stage "
                            f"'{missing[0]}' is not in {file.path}")
    changed = {}
    for name in file.downstream_closure(experiment.roots):
        stage = file.stages[name]
        settings = {k: v for k, v in experiment.params.items() if k in stage.params}
        if not settings:
            continue
        resolved = file.overridden(name, settings)
        if not same_value(resolved.params, stage.params):
            changed[name] = resolved
    return changed


def pipeline_of(baseline: Pipeline, experiment: Experiment) -> "ExperimentPipeline":
    """The stages as ``experiment`` has them. One seed of a group (``NAME-seedS``) shares what
    the seed does not change with its group's experiment, not the baseline: the group's own
    stages upstream of the seed are computed once for all its seeds."""
    base = baseline
    if experiment.group and experiment.group != experiment.name:
        group = experiment.base or read_experiment(baseline.workdir, experiment.group)
        base = pipeline_of(baseline, group)
    return ExperimentPipeline(base, experiment)


class ExperimentPipeline(Pipeline):
    """The stages as experiment ``experiment`` has them: its own stages checked and run in its
    folder, the others those of ``baseline`` (the workdir's, or the experiment it varies),
    checked and run there."""

    def __init__(self, baseline: Pipeline, experiment: Experiment):
        changed = changed_stages(baseline.file, experiment)
        varied = baseline.file.with_stages(changed)
        own = varied.downstream_closure(changed)
        moved = _from_workdir(varied, own, experiment, _root(baseline).workdir)
        super().__init__(varied.with_stages(moved) if moved else varied, experiment.folder,
                         baseline.commands, baseline.outs_outside_workdir)
        self.baseline = baseline
        self.experiment = experiment
        self.own = frozenset(own)

    def own_outs(self) -> set[str]:
        return {out for name in self.own for out in self.file.stages[name].outs}

    # -- status: own stages from the experiment's lock, others from the baseline's ------------
    def records(self) -> dict:
        own, shared = self._read_lock(), self.baseline.records()
        return {name: (own if name in self.own else shared).get(name) for name in self.file.order}

    def own_status(self, stage: Stage, record: Mapping | None = None) -> StageStatus:
        if stage.name not in self.own:
            return self.baseline.own_status(self.baseline.file.stage(stage.name), record)
        return super().own_status(stage, record)

    def statuses(self) -> dict[str, StageStatus]:
        self.refresh_links()
        return super().statuses()

    def refresh_links(self) -> None:
        """Make the folder show what the baseline (or the group's experiment) holds now."""
        if isinstance(self.baseline, ExperimentPipeline):
            self.baseline.refresh_links()
        mirror(self.baseline.workdir, self.workdir, self.own_outs())

    # -- running -----------------------------------------------------------------------------
    def run_stage(self, stage: Stage, force: bool, report: Callable[[str], None]) -> bool:
        """An own stage run here, under the experiment's name; another by the baseline (the
        group's experiment), there."""
        if stage.name not in self.own:
            return self.baseline.run_stage(self.baseline.file.stage(stage.name), force, report)
        self.refresh_links()
        return super().run_stage(stage, force,
                                 lambda m: report(f"[{self.experiment.name}] {m}"))

    def builtins(self) -> dict[str, str]:
        """``${experiment}``: the experiment's group (a seed's is its group's)."""
        return {"experiment": self.experiment.group}

    def run_hint(self, name: str) -> str:
        """The baseline's command for stage ``name``, under this experiment's name."""
        return f"{_root(self).run_hint(name)} --name {shlex.quote(self.experiment.name)}"


def _root(pipeline: Pipeline) -> Pipeline:
    """The workdir's own pipeline under any chain of experiments."""
    while isinstance(pipeline, ExperimentPipeline):
        pipeline = pipeline.baseline
    return pipeline


def run_lock(pipeline: Pipeline, name: str) -> Path:
    """The lock a run of stage ``name`` holds while it runs (``Pipeline.run_stage``'s), in the
    folder of whichever pipeline the stage belongs to: held, the stage is running."""
    while isinstance(pipeline, ExperimentPipeline) and name not in pipeline.own:
        pipeline = pipeline.baseline
    return pipeline.run_lock(name)


def _from_workdir(file: StagesFile, own: Iterable[str], experiment: Experiment,
                  workdir: Path) -> dict[str, Stage]:
    """The experiment's own stages whose params hold a relative path that leaves the workdir
    (``../x.yaml``, set or in the file), resolved with that path made absolute from the
    workdir: they run in ``exps/NAME/``, from where ``../x.yaml`` names another file."""
    resolved = {}
    for name in own:
        stage = file.stages[name]
        moved = {k: os.path.normpath(workdir / v) for k, v in stage.params.items()
                 if k != "key" and _leaves(v)}
        if moved:
            settings = {k: v for k, v in experiment.params.items() if k in stage.params}
            resolved[name] = file.overridden(name, {**settings, **moved})
    return resolved


def _leaves(value: Any) -> bool:
    """Whether ``value`` is a relative path out of the folder it is read from (``..``,
    ``../x``, ``a/../../x``)."""
    if not isinstance(value, str) or not value or os.path.isabs(value):
        return False
    norm = os.path.normpath(value)
    return norm == os.pardir or norm.startswith(os.pardir + os.sep)


# -- the experiment's view of the workdir ---------------------------------------------------
def mirror(workdir: Path, folder: Path, own_outs: Iterable[str]) -> None:
    """Make ``folder`` show ``workdir``'s files through relative links, except the experiment's
    own outs and the locks beside them (and the folders that hold one, real folders there): a
    link left where an own out or its lock goes is removed; a real file or folder is never
    replaced."""
    own = {os.path.normpath(o) for o in own_outs}
    # the lock beside an own out (runlock.lock_beside: a run folder's, a store's) is the
    # experiment's too: linked to the baseline's, every seed's run would refuse the others
    own |= {o + ".lock" for o in own}
    holders = {str(p) for o in own for p in Path(o).parents if str(p) != "."}
    skipped = {EXPERIMENTS, *_STATE}
    folder.mkdir(parents=True, exist_ok=True)
    for holder in sorted(holders, key=len):
        here = folder / holder
        if here.is_symlink():
            here.unlink(missing_ok=True)  # several runs of a group mirror its folder at once
        here.mkdir(exist_ok=True)
    for out in own:
        if (folder / out).is_symlink():
            (folder / out).unlink(missing_ok=True)

    def visit(relative: Path) -> None:
        source = workdir / relative
        for entry in sorted(os.scandir(source), key=lambda e: e.name):
            rel = relative / entry.name
            key = str(rel)
            if (relative == Path(".") and (entry.name in skipped
                                           or entry.name.endswith(".lock"))) or key in own:
                continue
            if key in holders:
                if entry.is_dir():
                    visit(rel)
                continue
            _link(folder / rel, workdir / rel)

    visit(Path("."))


def _link(path: Path, target: Path) -> None:
    """A relative link at ``path`` to ``target``; an existing link is pointed there again, an
    existing real file or folder kept."""
    relative = os.path.relpath(target, path.parent)
    if path.is_symlink():
        if os.readlink(path) == relative:
            return
        path.unlink(missing_ok=True)  # missing: another run of the group relinked it first
    elif path.exists():
        return
    with contextlib.suppress(FileExistsError):  # made by another run of the group at once
        path.symlink_to(relative)


def pipelines_listed(baseline: Pipeline) -> list[ExperimentPipeline]:
    """Every experiment's stages, for a listing (``exp list``, ``exp show``): one that cannot be
    used (its manifest damaged, its group's too, a stage of it no longer in the stages file) is
    said in a warning and left out, so it never hides the others."""
    pipelines = []
    for experiment in experiments(baseline.workdir):
        try:
            pipelines.append(pipeline_of(baseline, experiment))
        except CapstackError as e:
            log.warning("experiment '%s': %s; not listed", experiment.name, e)
    return pipelines
