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

The manifest ``exps/NAME/experiment.yaml`` records the settings; asking the same name for other
settings is refused with what differs. Removing an experiment removes its folder: its own outs
and the links, never what a link points to.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from pipeline.core.regular import read_text
from pipeline.core.yamlfile import check_expanded
from pipeline.engine.stagefile import Stage, StagesFile, parse_assignment
from pipeline.engine.stages import Pipeline, StageStatus, same_value

EXPERIMENTS = "exps"  # the experiments' folder, under the workdir
MANIFEST = "experiment.yaml"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]*$")
_STATE = {".capstack", MANIFEST}  # an experiment's own bookkeeping, never a link


@dataclass(frozen=True)
class Experiment:
    """One experiment's manifest: its name, its settings and the stages they were set on.

    ``group``: what the report calls its rows; the experiment's name, except for one seed of a
    seeds axis (``--seeds``), which is its group's (``""``: the baseline's) at another seed.
    """

    name: str
    params: dict[str, Any]
    roots: tuple[str, ...]
    group: str
    created: str = ""
    folder: Path = field(default=Path("."), compare=False)


def folder_of(workdir: Path, name: str) -> Path:
    return Path(workdir) / EXPERIMENTS / name


def check_name(name: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise CapstackError(f"--name {name}: an experiment's name is letters, digits and "
                            f"'_.+=-', starting with a letter or digit")
    return name


def auto_name(params: Mapping[str, Any]) -> str:
    """A name said by the settings, for ``--set`` without ``--name``: ``min_count-3``."""
    words = [re.sub(r"[^A-Za-z0-9_.+-]+", "-", f"{k}-{v}").strip("-") for k, v in params.items()]
    return "+".join(words)


def read_experiment(workdir: Path, name: str) -> Experiment:
    """The manifest of experiment ``name``; a CapstackError naming the file when it is missing
    or damaged."""
    folder = folder_of(workdir, name)
    path = folder / MANIFEST
    try:
        doc = yaml.safe_load(read_text(path, "an experiment manifest"))
    except FileNotFoundError:
        known = ", ".join(e.name for e in experiments(workdir)) or "none"
        raise CapstackError(f"no experiment named '{name}' in {workdir} (experiments: "
                            f"{known})") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        raise CapstackError(f"{path}: not a readable experiment manifest ({e})") from None
    check_expanded(doc, str(path), "an experiment manifest")
    ok = isinstance(doc, dict) and isinstance(doc.get("params"), dict) \
        and isinstance(doc.get("roots"), list) and all(isinstance(r, str) for r in doc["roots"])
    if not ok or doc.get("name") != name:
        raise CapstackError(f"{path}: not an experiment manifest of '{name}' (expected name, "
                            f"params and roots)")
    return Experiment(name, dict(doc["params"]), tuple(doc["roots"]),
                      str(doc.get("group", name)), str(doc.get("created", "")), folder)


def experiments(workdir: Path) -> list[Experiment]:
    """Every experiment under the workdir, by name."""
    root = Path(workdir) / EXPERIMENTS
    names = sorted(p.parent.name for p in root.glob(f"*/{MANIFEST}")) if root.is_dir() else []
    return [read_experiment(workdir, n) for n in names]


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
                    roots: Iterable[str] = (), group: str | None = None) -> Experiment:
    """Experiment ``name``, made with ``params`` on stages ``roots`` when new. An existing one
    must have been made with exactly ``params`` (none given: whatever it has); ``roots`` join
    its roots. Other settings under the same name are refused with what differs."""
    roots = tuple(roots)
    check_name(name)
    if not (folder_of(workdir, name) / MANIFEST).is_file():
        if not params:
            raise CapstackError(f"no experiment named '{name}' in {workdir}; make one with "
                                f"`capstack run STAGE --set NAME=VALUE --name {name}`")
        experiment = Experiment(name, dict(params), roots,
                                name if group is None else group,
                                time.strftime("%Y-%m-%dT%H:%M:%S"), folder_of(workdir, name))
        _write(experiment)
        return experiment
    experiment = read_experiment(workdir, name)
    if params and not same_value(dict(params), experiment.params):
        raise CapstackError(
            f"experiment '{name}' was made with other settings "
            f"({'; '.join(settings_differences(experiment.params, params))}); run it without "
            f"--set, or choose another --name, or `capstack exp remove {name}` first")
    added = tuple(r for r in roots if r not in experiment.roots) if params else ()
    if added:
        experiment = Experiment(experiment.name, experiment.params,
                                (*experiment.roots, *added), experiment.group,
                                experiment.created, experiment.folder)
        _write(experiment)
    return experiment


def remove_experiments(workdir: Path, names: Iterable[str]) -> list[Path]:
    """Remove experiments' folders (their own outs and their links, never what a link points
    to); returns the folders. An experiment whose seeds (``NAME-seedS``) share its stages goes
    only with them."""
    chosen = [read_experiment(workdir, n) for n in dict.fromkeys(names)]
    names = {e.name for e in chosen}
    for e in chosen:
        left = [o.name for o in experiments(workdir)
                if o.group == e.name and o.name != e.name and o.name not in names]
        if left:
            raise CapstackError(f"experiment '{e.name}': {', '.join(left)} share its stages "
                                f"(its seeds); remove them too, or first")
    for e in chosen:
        shutil.rmtree(e.folder)  # removes links as links: it follows none
    return [e.folder for e in chosen]


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
        base = pipeline_of(baseline, read_experiment(baseline.workdir, experiment.group))
    return ExperimentPipeline(base, experiment)


class ExperimentPipeline(Pipeline):
    """The stages as experiment ``experiment`` has them: its own stages checked and run in its
    folder, the others those of ``baseline`` (the workdir's, or the experiment it varies),
    checked and run there."""

    def __init__(self, baseline: Pipeline, experiment: Experiment):
        changed = changed_stages(baseline.file, experiment)
        super().__init__(baseline.file.with_stages(changed), experiment.folder,
                         baseline.commands, baseline.outs_outside_workdir)
        self.baseline = baseline
        self.experiment = experiment
        self.own = frozenset(self.file.downstream_closure(changed))

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
        root = self.baseline
        while isinstance(root, ExperimentPipeline):
            root = root.baseline
        return f"{root.run_hint(name)} --name {shlex.quote(self.experiment.name)}"


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
            here.unlink()
        here.mkdir(exist_ok=True)
    for out in own:
        if (folder / out).is_symlink():
            (folder / out).unlink()

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
        path.unlink()
    elif path.exists():
        return
    path.symlink_to(relative)


def settings_of(text: Iterable[str], stage: Stage, file: StagesFile) -> dict[str, Any]:
    """``--set NAME=VALUE`` words as the params they set on ``stage``, typed like its own."""
    return dict(parse_assignment(t, stage, file.path) for t in text)


# -- what `capstack run` is asked -----------------------------------------------------------
def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` or ``0-4`` (or both: ``0-2,7``) as seeds in the given order, once each."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise CapstackError(f"--seeds {text}: expected seeds as 0,1,2 or 0-4")
        for seed in range(int(low), int(high or low) + 1):
            if seed not in seeds:
                seeds.append(seed)
    if not seeds:
        raise CapstackError(f"--seeds {text}: names no seed")
    return seeds


def runs_asked(pipeline: Pipeline, stage_name: str, assignments: Iterable[str],
               name: str | None, seeds: Iterable[int] = ()) -> list[Experiment | None]:
    """The experiments ``capstack run STAGE`` runs the stage in (``None``: the baseline), made
    or checked: without ``--name``, ``--set`` makes one named by its settings; with
    ``--seeds``, one run per seed, each seed other than the stage's own an experiment of its
    own (``NAME-seedS``; ``seedS`` for the baseline's settings) whose report rows are
    ``NAME``'s (the baseline's) at that seed."""
    file, workdir = pipeline.file, pipeline.workdir
    stage = file.stage(stage_name)
    params = asked = settings_of(assignments, stage, file)
    roots: tuple[str, ...] = (stage_name,) if params or seeds else ()  # set on this stage
    if name and not params and (folder_of(workdir, name) / MANIFEST).is_file():
        existing = read_experiment(workdir, name)
        params, roots = existing.params, (*existing.roots, *roots)
    group = name or (auto_name(params) if params else "")
    seeds = list(seeds)
    if not seeds:
        return [open_experiment(workdir, group, params, roots) if group else None]
    if "seed" not in stage.params:
        if asked:
            raise CapstackError(f"--seeds with --set: stage '{stage_name}' has no param 'seed'; "
                                f"set the params and seeds on a stage that has one")
        return [_seed_run(file, workdir, group, seed, stage_name) for seed in seeds]
    if "seed" in asked:
        raise CapstackError("--seeds with a seed set (--set seed=...): give the seeds only")
    own_seed = params.get("seed", stage.params["seed"])  # the group's seed: the group itself
    runs: list[Experiment | None] = []
    for seed in seeds:
        if seed == own_seed:
            runs.append(open_experiment(workdir, group, params, roots) if group else None)
        else:
            runs.append(open_experiment(workdir, f"{group}-seed{seed}" if group else
                                        f"seed{seed}", {**params, "seed": seed}, roots,
                                        group=group))
    return runs


def _seed_run(file: StagesFile, workdir: Path, group: str, seed: int,
              stage_name: str) -> Experiment | None:
    """Where a stage without a seed param runs at ``seed``: the seed's experiment, made on a
    stage upstream that has one (``capstack run train@X --seeds ...``), or the group itself
    (``None``: the baseline) at the seed the group has there."""
    name = f"{group}-seed{seed}" if group else f"seed{seed}"
    if (folder_of(workdir, name) / MANIFEST).is_file():
        return read_experiment(workdir, name)
    group_params = read_experiment(workdir, group).params if group else {}
    seeded = [r for e in experiments(workdir) if e.group == group and e.name != group
              for r in e.roots if r in file.stages and "seed" in file.stages[r].params]
    if not seeded:  # no other seed run yet: the seed of the stages upstream that have one
        seeded = [u for u in file.upstream_closure(stage_name) if "seed" in file.stages[u].params]
    own = {group_params.get("seed", file.stages[r].params["seed"]) for r in seeded}
    if own == {seed}:
        return read_experiment(workdir, group) if group else None
    raise CapstackError(f"--seeds: no experiment {name} for stage '{stage_name}', which has no "
                        f"param 'seed': run the seeds on a stage upstream that has one first "
                        f"(`capstack run STAGE --seeds ...`), then this stage over them")

