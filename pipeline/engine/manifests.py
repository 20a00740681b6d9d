"""An experiment's name, its manifest and its folder: ``exps/NAME/experiment.yaml`` records
the settings, written when the experiment's first stage runs (a refused command makes no
folder); asking the same name for other settings is refused with what differs. Removing an
experiment removes its folder, unless a run holds one of its locks: its own outs and the links,
never what a link points to. A name is checked wherever it is read: it never names a folder
outside ``exps/`` (experiments.py: what an experiment runs; planning.py: what a command asks).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import yaml

from pipeline.core.atomic import atomic_file, unused_sibling
from pipeline.core.errors import CapstackError, shown
from pipeline.core.regular import NotRegular, read_text
from pipeline.core.runlock import holding_all
from pipeline.core.yamlfile import check_expanded
from pipeline.engine.stages import same_value

log = logging.getLogger(__name__)

EXPERIMENTS = "exps"  # the experiments' folder, under the workdir
MANIFEST = "experiment.yaml"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*")  # whole: fullmatch (``$`` lets "a\n" by)


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

