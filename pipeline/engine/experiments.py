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

The manifest ``exps/NAME/experiment.yaml`` records the settings, written when the experiment's
first stage runs (a refused command makes no folder); asking the same name for other settings
is refused with what differs. A param of an own stage holding a relative path that leaves the
workdir (``../x.yaml``) is made absolute from the workdir, so it names the baseline's file.
Removing an experiment removes its folder, unless a run holds one of its locks: its own outs
and the links, never what a link points to. A name is checked wherever it is read: it never
names a folder outside ``exps/``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import yaml

from pipeline.core.atomic import atomic_file, unused_sibling
from pipeline.core.errors import CapstackError, shown
from pipeline.core.regular import NotRegular, read_text
from pipeline.core.runlock import holding_all
from pipeline.core.yamlfile import check_expanded
from pipeline.engine.stagefile import Stage, StagesFile, parse_values
from pipeline.engine.stages import Pipeline, StageStatus, same_value

log = logging.getLogger(__name__)

EXPERIMENTS = "exps"  # the experiments' folder, under the workdir
MANIFEST = "experiment.yaml"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*")  # whole: fullmatch (``$`` lets "a\n" by)
_STATE = {".capstack", MANIFEST}  # an experiment's own bookkeeping, never a link
MAX_SEEDS = 100  # seeds one --seeds may name: each is a run, most an experiment of its own
MAX_SEED = 2**32 - 1  # the largest seed (train.seed's bound)
MAX_RUNS = 1000  # runs one command may plan: a grid's points times its seeds


@dataclass(frozen=True)
class Experiment:
    """One experiment's manifest: its name, its settings and the stages they were set on.

    ``group``: what the report calls its rows; the experiment's name, except for one seed of a
    seeds axis (``--seeds``), which is its group's (``""``: the baseline's) at another seed.

    ``base``: the group's experiment of a seed, as this command has it (maybe not written
    yet); ``unsaved``: the manifest on disk lacks it (new, or its roots grew), written by
    :func:`save_experiment` when its stage runs.
    """

    name: str
    params: dict[str, Any]
    roots: tuple[str, ...]
    group: str
    created: str = ""
    folder: Path = field(default=Path("."), compare=False)
    base: Experiment | None = field(default=None, compare=False, repr=False)
    unsaved: bool = field(default=False, compare=False)


class UnusableExperiment(CapstackError):
    """A folder under ``exps/`` no command can use as it is (its manifest damaged, and set
    aside; the folder a symbolic link; a name no experiment has): refused when named, said and
    left out by a listing, so it never hides the other experiments."""


def folder_of(workdir: Path, name: str) -> Path:
    return Path(workdir) / EXPERIMENTS / name


def check_name(name: str, option: str = "--name") -> str:
    """``name`` when it names a folder right under ``exps/``; checked wherever a name is read,
    not only where one is made: ``../../x`` would reach a folder outside the workdir."""
    if not _NAME.fullmatch(name):
        raise UnusableExperiment(f"{option} {shown(name)}: an experiment's name is letters, "
                                 f"digits and '_.+=-', starting with a letter or digit")
    return name


def auto_name(params: Mapping[str, Any]) -> str:
    """A name said by the settings, for ``--set`` without ``--name``: ``min_count-3``."""
    words = [re.sub(r"[^A-Za-z0-9_.+-]+", "-", f"{k}-{v}").strip("-") for k, v in params.items()]
    return "+".join(words)


def read_experiment(workdir: Path, name: str) -> Experiment:
    """The manifest of experiment ``name``; a CapstackError naming the file when it is missing,
    refused (an alias bomb, a FIFO) or damaged: a damaged one is set aside
    (``experiment.yaml.damaged``, never deleted), as a damaged lock file is."""
    check_name(name, "experiment")
    folder = _real_folder(workdir, name)
    path = folder / MANIFEST
    try:
        text = read_text(path, "an experiment manifest")
    except FileNotFoundError:
        raise _missing(workdir, name) from None
    except NotRegular as e:  # never read, nor moved: a listing says it and goes on
        raise UnusableExperiment(str(e)) from None
    except UnicodeDecodeError:
        raise _set_aside(path, name, "not UTF-8 text") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _set_aside(path, name, f"not valid YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise _set_aside(path, name, "nested too deeply to be a manifest") from None
    try:
        check_expanded(doc, str(path), "an experiment manifest")
    except CapstackError as e:  # an alias bomb: damaged, as any manifest no experiment wrote
        raise _set_aside(path, name, str(e).removeprefix(f"{path}: ")) from None
    ok = isinstance(doc, dict) and isinstance(doc.get("params"), dict) \
        and isinstance(doc.get("roots"), list) and all(isinstance(r, str) for r in doc["roots"])
    if not ok or doc.get("name") != name:
        raise _set_aside(path, name, f"not an experiment manifest of '{name}': expected its "
                                     f"name, params and roots")
    return Experiment(name, dict(doc["params"]), tuple(doc["roots"]),
                      str(doc.get("group", name)), str(doc.get("created", "")), folder)


def _real_folder(workdir: Path, name: str) -> Path:
    """The folder of experiment ``name``, refused when it is a symbolic link: whatever it
    points to is no folder capstack made, and a view or a run would write links there."""
    folder = folder_of(workdir, name)
    if folder.is_symlink():
        raise UnusableExperiment(
            f"{folder}: a symbolic link (to {os.readlink(folder)}); an experiment's folder is "
            f"a real folder capstack makes and writes in: `capstack exp remove {name}` removes "
            f"the link, never what it points to")
    return folder


class NoSuchExperiment(CapstackError):
    """No experiment of that name (no folder, or one holding no manifest)."""


def _missing(workdir: Path, name: str) -> CapstackError:
    folder = folder_of(workdir, name)
    damaged = sorted(folder.glob(f"{MANIFEST}.damaged*")) if folder.is_dir() else []
    if damaged:
        return UnusableExperiment(f"experiment '{name}': its manifest was damaged, and set "
                                  f"aside as {damaged[-1]}; `capstack exp remove {name}` "
                                  f"removes its folder")
    known = ", ".join(e.name for e in experiments(workdir)) or "none"
    return NoSuchExperiment(f"no experiment named '{name}' in {workdir} (experiments: {known})")


def _set_aside(path: Path, name: str, problem: str) -> UnusableExperiment:
    """Move a damaged manifest aside (never deleted): the experiment is then unknown, and
    every other one readable."""
    kept = unused_sibling(path, ".damaged")
    with contextlib.suppress(FileNotFoundError):  # another process set it aside first
        os.replace(path, kept)
    return UnusableExperiment(f"{path}: damaged experiment manifest ({problem}); moved to "
                              f"{kept}: `capstack exp remove {name}` removes its folder")


def experiments(workdir: Path) -> list[Experiment]:
    """Every experiment under the workdir, by name; a folder none can use (a damaged manifest,
    set aside; a link) is said in a warning and left out."""
    root = Path(workdir) / EXPERIMENTS
    names = sorted(p.parent.name for p in root.glob(f"*/{MANIFEST}")) if root.is_dir() else []
    found = []
    for name in names:
        try:
            found.append(read_experiment(workdir, name))
        except UnusableExperiment as e:
            log.warning("%s; not listed", e)
    return found


def _write(experiment: Experiment) -> None:
    experiment.folder.mkdir(parents=True, exist_ok=True)
    doc = {"name": experiment.name, "group": experiment.group, "params": experiment.params,
           "roots": list(experiment.roots), "created": experiment.created}
    with atomic_file(experiment.folder / MANIFEST) as tmp:
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))


def settings_differences(recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> list[str]:
    """``name: recorded -> asked`` for each param set differently (``(not set)`` for one side
    without it)."""
    unset = "(not set)"
    return [f"{k}: {recorded.get(k, unset)} -> {asked.get(k, unset)}"
            for k in [*recorded, *(k for k in asked if k not in recorded)]
            if k not in recorded or k not in asked or recorded[k] != asked[k]]


def open_experiment(workdir: Path, name: str, params: Mapping[str, Any],
                    roots: Iterable[str] = (), group: str | None = None,
                    base: Experiment | None = None) -> Experiment:
    """Experiment ``name``, made with ``params`` on stages ``roots`` when new. An existing one
    must have been made with exactly ``params`` (none given: whatever it has); ``roots`` join
    its roots. Other settings under the same name are refused with what differs. Nothing is
    written: a new experiment, or new roots, are ``unsaved`` until :func:`save_experiment`."""
    roots = tuple(roots)
    check_name(name)
    if not (_real_folder(workdir, name) / MANIFEST).is_file():
        if not params:
            raise _missing_to_make(workdir, name)
        return Experiment(name, dict(params), roots, name if group is None else group,
                          time.strftime("%Y-%m-%dT%H:%M:%S"), folder_of(workdir, name), base,
                          unsaved=True)
    experiment = read_experiment(workdir, name)
    if params and not same_value(dict(params), experiment.params):
        raise CapstackError(
            f"experiment '{name}' was made with other settings "
            f"({'; '.join(settings_differences(experiment.params, params))}); run it without "
            f"--set, or choose another --name, or `capstack exp remove {name}` first")
    added = tuple(r for r in roots if r not in experiment.roots) if params else ()
    return Experiment(experiment.name, experiment.params, (*experiment.roots, *added),
                      experiment.group, experiment.created, experiment.folder, base,
                      unsaved=bool(added))


def _missing_to_make(workdir: Path, name: str) -> CapstackError:
    try:
        read_experiment(workdir, name)  # says why what is there is none (damaged, a FIFO)
    except NoSuchExperiment:
        pass
    except CapstackError as e:
        return e
    return NoSuchExperiment(f"no experiment named '{name}' in {workdir}; make one with "
                            f"`capstack run STAGE --set NAME=VALUE --name {name}`")


def save_experiment(experiment: Experiment) -> list[Path]:
    """Write the manifest of ``experiment`` (its group's first, for a seed) where it is
    ``unsaved``: done when its stage runs, so a refused command, or seeds not reached, leave
    no folder. Returns the folders this made."""
    made = save_experiment(experiment.base) if experiment.base is not None else []
    if experiment.unsaved:
        if not experiment.folder.exists():
            made.append(experiment.folder)
        _write(experiment)
    return made


@contextlib.contextmanager
def running_in(experiment: Experiment | None) -> Iterator[None]:
    """Around a run in ``experiment`` (None: the baseline): its manifest written first; a
    refusal said with the experiment's name; and a folder made for this run that holds no
    result when it is refused (the manifest, links, the engine's bookkeeping only) removed
    again, so that the same name with other settings is no experiment "made with other
    settings" that never ran."""
    if experiment is None:
        yield
        return
    made = save_experiment(experiment)
    try:
        yield
    except CapstackError as e:
        undone = [folder for folder in reversed(made) if _remove_if_empty(folder)]
        said = f" (its folder {experiment.folder}, made for this run, is removed again: it " \
               f"held no result)" if experiment.folder in undone else ""
        raise CapstackError(f"experiment '{experiment.name}': {e}{said}") from None


def _remove_if_empty(folder: Path) -> bool:
    """Remove ``folder`` when it holds no file a run wrote and no run holds it."""
    if _first_result(folder) is not None:
        return False
    try:
        with holding_all(run_locks(folder), f"experiment folder {folder}"):
            shutil.rmtree(folder)
    except CapstackError:
        return False
    return True


def _first_result(folder: Path) -> str | None:
    """The first file under ``folder`` that is more than making an experiment leaves (its
    manifest, links to the baseline's files, the engine's ``.capstack/``, a released run lock:
    an empty ``*.lock``), or None."""
    for here, dirs, files in os.walk(folder):
        top = Path(here) == folder
        if top:
            dirs[:] = [d for d in dirs if d != ".capstack"]
        for name in files:
            path = Path(here) / name
            if path.is_symlink() or (top and name == MANIFEST) \
                    or (name.endswith(".lock") and path.stat().st_size == 0):
                continue
            return str(path.relative_to(folder))
    return None


def remove_experiments(workdir: Path, names: Iterable[str]) -> list[Path]:
    """Remove experiments' folders (their own outs and their links, never what a link points
    to; a folder that is a link: the link); returns the folders. An experiment whose seeds
    (``NAME-seedS``) share its stages goes only with them; one whose run holds a lock (a stage
    of it running, a training writing there) is refused, naming the holder."""
    names = list(dict.fromkeys(names))
    folders = [_removable(workdir, n) for n in names]
    others = experiments(workdir)
    for name in names:
        left = [o.name for o in others
                if o.group == name and o.name != name and o.name not in names]
        if left:
            raise CapstackError(f"experiment '{name}': {', '.join(left)} share its stages "
                                f"(its seeds); remove them too, or first")
    with contextlib.ExitStack() as held:  # every run lock held while any folder goes
        for name, folder in zip(names, folders):
            if not folder.is_symlink():
                held.enter_context(holding_all(run_locks(folder), f"experiment '{name}'"))
        for folder in folders:
            if folder.is_symlink():
                folder.unlink()  # the link; what it points to is kept
            else:
                shutil.rmtree(folder)  # removes links as links: it follows none
    return folders


def _removable(workdir: Path, name: str) -> Path:
    """The folder ``exp remove NAME`` removes: an experiment's (its manifest readable or set
    aside), or a link standing where one goes."""
    check_name(name, "exp remove")
    folder = folder_of(workdir, name)
    if folder.is_symlink() or (folder.is_dir() and any(folder.glob(f"{MANIFEST}*"))):
        return folder
    raise _missing(workdir, name)


def run_locks(folder: Path) -> list[Path]:
    """The locks a run in an experiment's ``folder`` holds: each stage's
    (``.capstack/running/*.pid``) and those beside the outs it writes (a training's
    ``runs/NAME.lock``). Links are not followed: what they show is the baseline's."""
    found = []
    for here, _, files in os.walk(folder):
        for name in files:
            path = Path(here) / name
            if name.endswith((".lock", ".pid")) and not path.is_symlink():
                found.append(path)
    return found


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
    def _records(self) -> dict:
        own, shared = self._read_lock(), self.baseline._records()
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
    def _run_one(self, stage: Stage, force: bool, report: Callable[[str], None]) -> bool:
        if stage.name not in self.own:
            return self.baseline._run_one(self.baseline.file.stage(stage.name), force, report)
        self.refresh_links()
        return super()._run_one(stage, force,
                                lambda m: report(f"[{self.experiment.name}] {m}"))

    def _stage_environment(self) -> dict[str, str]:
        return {"CAPSTACK_EXPERIMENT": self.experiment.group}

    def run_hint(self, name: str) -> str:
        """The baseline's command for stage ``name``, under this experiment's name."""
        return f"{_root(self).run_hint(name)} --name {shlex.quote(self.experiment.name)}"


def _root(pipeline: Pipeline) -> Pipeline:
    """The workdir's own pipeline under any chain of experiments."""
    while isinstance(pipeline, ExperimentPipeline):
        pipeline = pipeline.baseline
    return pipeline


def run_lock(pipeline: Pipeline, name: str) -> Path:
    """The lock a run of stage ``name`` holds while it runs (``Pipeline._run_one``'s), in the
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


def grid_of(text: Iterable[str], stage: Stage, file: StagesFile, runs_each: int = 1
            ) -> list[dict[str, Any]]:
    """``--set`` words as the grid of settings they list (``lr=1e-4,5e-4``:
    stagefile.parse_values), one mapping per point, the first name's values outermost;
    ``[{}]`` for none. A name given again keeps its last values, as a setting given again
    does. Counted before it is made: with ``runs_each`` runs a point (its seeds), at most
    ``MAX_RUNS``."""
    axes: dict[str, list[Any]] = {}
    for t in text:
        key, values = parse_values(t, stage, file.path)
        axes[key] = values
    points = 1
    for values in axes.values():
        points *= len(values)
    if points * max(1, runs_each) > MAX_RUNS:
        raise CapstackError(f"--set: a grid of {points} settings"
                            f"{f' times {runs_each} seeds' if runs_each > 1 else ''} is more than "
                            f"the {MAX_RUNS} runs one command plans")
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


# -- what `capstack run` is asked -----------------------------------------------------------
_SEED_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?")  # [0-9]: ASCII digits only (not \\d, "²")


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` or ``0-4`` (or both: ``0-2,7``) as seeds in the given order, once each: at most
    ``MAX_SEEDS``, each from 0 to ``MAX_SEED``; counted before a range is expanded, so the parse
    takes time in proportion to the text."""
    seeds: dict[int, None] = {}
    for part in (p.strip() for p in text.split(",")):
        match = _SEED_PART.fullmatch(part)
        if not match:
            raise CapstackError(f"--seeds {shown(text)}: expected seeds as 0,1,2 or 0-4 "
                                f"(ASCII digits), got {shown(part)}")
        low, high = (_seed(text, d) for d in (match[1], match[2] or match[1]))
        if high < low:
            raise CapstackError(f"--seeds {shown(text)}: {part} is no range; write it upwards "
                                f"({high}-{low})")
        if high - low >= MAX_SEEDS:
            raise _too_many(text)
        seeds.update(dict.fromkeys(range(low, high + 1)))
        if len(seeds) > MAX_SEEDS:
            raise _too_many(text)
    return list(seeds)


def _seed(text: str, digits: str) -> int:
    if len(digits) > len(str(MAX_SEED)) or int(digits) > MAX_SEED:
        raise CapstackError(f"--seeds {shown(text)}: a seed is from 0 to {MAX_SEED}, got "
                            f"{shown(digits)}")
    return int(digits)


def _too_many(text: str) -> CapstackError:
    return CapstackError(f"--seeds {shown(text)}: names more than {MAX_SEEDS} seeds, the most "
                         f"one command runs (each a run, most an experiment of its own)")


def runs_asked(pipeline: Pipeline, stage_name: str, assignments: Iterable[str],
               name: str | None, seeds: Iterable[int] = ()) -> list[Experiment | None]:
    """The experiments ``capstack run STAGE`` runs the stage in (``None``: the baseline),
    checked, not written (:func:`running_in` writes each when its stage runs): without
    ``--name``, ``--set`` makes one named by its settings; with ``--seeds``, one run per seed,
    each seed other than the stage's own an experiment of its own (``NAME-seedS``; ``seedS``
    for the baseline's settings) whose report rows are ``NAME``'s (the baseline's) at that
    seed. A ``--set`` listing several values (:func:`grid_of`) makes one group per point of
    the grid, each named by its settings (``NAME+`` the settings that vary, with ``--name``),
    and the seeds cross it."""
    seeds = list(seeds)
    stage = pipeline.file.stage(stage_name)
    grid = grid_of(assignments, stage, pipeline.file, len(seeds))
    if len(grid) == 1:
        return _runs_at(pipeline, stage_name, grid[0], name, seeds)
    varying = [k for k in grid[0] if any(not same_value(p[k], grid[0][k]) for p in grid)]
    runs: list[Experiment | None] = []
    for point in grid:
        group = f"{name}+{auto_name({k: point[k] for k in varying})}" if name \
            else auto_name(point)
        runs += _runs_at(pipeline, stage_name, point, group, seeds)
    names = [r.name for r in runs if r is not None]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise CapstackError(f"--set: two points of the grid would both be experiment '{twice}' "
                            f"(a name keeps letters, digits and '_.+-' of the values); give "
                            f"values that differ there")
    return runs


def _runs_at(pipeline: Pipeline, stage_name: str, asked: dict[str, Any], name: str | None,
             seeds: list[int]) -> list[Experiment | None]:
    """:func:`runs_asked` at one point of the grid: the settings ``asked``."""
    file, workdir = pipeline.file, pipeline.workdir
    stage = file.stage(stage_name)
    params = asked
    roots: tuple[str, ...] = (stage_name,) if params or seeds else ()  # set on this stage
    if name and not params and (folder_of(workdir, name) / MANIFEST).is_file():
        existing = read_experiment(workdir, name)
        params, roots = existing.params, (*existing.roots, *roots)
    group = name or (auto_name(params) if params else "")
    if not seeds:
        return [open_experiment(workdir, group, params, roots) if group else None]
    if "seed" not in stage.params:
        if asked:
            raise CapstackError(f"--seeds with --set: stage '{stage_name}' has no param 'seed'; "
                                f"set the params and seeds on a stage that has one")
        return _seed_runs(file, workdir, group, seeds, stage_name)
    if "seed" in asked:
        raise CapstackError("--seeds with a seed set (--set seed=...): give the seeds only")
    own_seed = params.get("seed", stage.params["seed"])  # the group's seed: the group itself
    base = open_experiment(workdir, group, params, roots) if group else None
    return [base if seed == own_seed else
            open_experiment(workdir, f"{group}-seed{seed}" if group else f"seed{seed}",
                            {**params, "seed": seed}, roots, group=group, base=base)
            for seed in seeds]


def _seed_runs(file: StagesFile, workdir: Path, group: str, seeds: list[int],
               stage_name: str) -> list[Experiment | None]:
    """Where a stage without a seed param runs at each of ``seeds``: the seed's experiment,
    made on a stage upstream that has one (``capstack run train@X --seeds ...``), or the group
    itself (``None``: the baseline) at the seed the group has there."""
    runs: list[Experiment | None] = []
    others: list[Experiment] | None = None  # the experiments, read once when needed
    for seed in seeds:
        name = f"{group}-seed{seed}" if group else f"seed{seed}"
        if (folder_of(workdir, name) / MANIFEST).is_file():
            runs.append(read_experiment(workdir, name))
            continue
        group_params = read_experiment(workdir, group).params if group else {}
        others = experiments(workdir) if others is None else others
        seeded = [r for e in others if e.group == group and e.name != group
                  for r in e.roots if r in file.stages and "seed" in file.stages[r].params]
        if not seeded:  # no other seed run yet: the seed of the stages upstream that have one
            seeded = [u for u in file.upstream_closure(stage_name)
                      if "seed" in file.stages[u].params]
        own = {group_params.get("seed", file.stages[r].params["seed"]) for r in seeded}
        if own != {seed}:
            raise CapstackError(
                f"--seeds: no experiment {name} for stage '{stage_name}', which has no param "
                f"'seed': run the seeds on a stage upstream that has one first (`capstack run "
                f"STAGE --seeds ...`), then this stage over them")
        runs.append(read_experiment(workdir, group) if group else None)
    return runs


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
