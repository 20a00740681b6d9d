"""The stage engine: decide which stages are up to date, say why, run one.

A stage is up to date when the record of its last successful run (its entry
in the lock file ``<workdir>/<stages file stem>.lock``) matches, checked in this
order as dvc does: the command line as written, the params (by value), the version of the
code the command runs, the content of every dep, and the outs still being what
the run wrote. Each mismatch becomes a reason such as
``param min_count 5 -> 3`` or ``dep data/shapes changed``.

Running a stage runs its command in a child process in the workdir, under an
exclusive lock naming its holder: a capstack command as ``python cli.py ...``
(capstack's own script, never one found on PATH or in the working folder),
another program as its words, looked up as a shell would (a name on PATH, a
path from the workdir) but never through a shell unless the stage says
``shell: true``. capstack's commands write their outs under temporary names and
rename them when complete; the engine writes the lock entry only after the
command succeeded and every out exists and was hashed, so a stage killed or
failed half way is never recorded as done. The command runs in a process group of its
own, through a keeper (keeper.py): its processes, a shell's children too, end with the
engine when it is stopped or killed, and the stage stays locked until they have.

Only a capstack command has a code version (the code of the source files its
module imports or its plug packages load, and the installed version of a
distribution one of them names in ``CODE_DISTRIBUTIONS``: codeversion.py). Another
program's code is what the stage lists among its deps.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import shutil
import signal
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, TypeGuard
from urllib.parse import quote

import yaml

from pipeline.core.atomic import atomic_file, unused_sibling
from pipeline.core.entry import capstack_command
from pipeline.core.errors import CapstackError, shown
from pipeline.core.hashing import HashCache
from pipeline.core.pointer import target_of
from pipeline.core.regular import read_text
from pipeline.core.yamlfile import extends_chain
from pipeline.core.runlock import (exclusive_beside, exclusive_run, lock_beside,
                                   waiting_lock)
from pipeline.engine.codeversion import (CODE_RULE, code_digest, code_distributions, code_files,
                                         distribution_versions, project_root)
from pipeline.engine.interpolation import with_given
from pipeline.engine.keeper import run_kept
from pipeline.engine.stagefile import Stage, StagesFile

UP_TO_DATE, STALE, NEVER_RUN = "up to date", "stale", "never run"
LOCK_SCHEMA = 1
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageStatus:
    name: str
    state: str
    reasons: tuple[str, ...] = ()

    @property
    def up_to_date(self) -> bool:
        return self.state == UP_TO_DATE

    def describe(self) -> str:
        return f"{self.state}: {'; '.join(self.reasons)}" if self.reasons else self.state


def _as_typed(path: Path, here: Path) -> str:
    """``path`` as a user in ``here`` types it: relative when inside, else absolute."""
    path = path.resolve()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two workdir-relative paths holds the other (or they are the same)."""
    a, b = os.path.normpath(a) + os.sep, os.path.normpath(b) + os.sep
    return a.startswith(b) or b.startswith(a)


def _is_lock_records(stages) -> TypeGuard[dict]:
    """Whether a lock file's ``stages`` reads as records: each a mapping whose parts are the
    types a status reads (a hand-edited or half-written file may hold anything)."""
    if not isinstance(stages, dict):
        return False
    for record in stages.values():
        if not isinstance(record, dict):
            return False
        if not all(isinstance(record.get(k) or {}, dict) for k in ("params", "code", "deps",
                                                                     "outs")):
            return False
        if not all(isinstance(v or {}, dict) for k in ("deps", "outs")
                   for v in (record.get(k) or {}).values()):
            return False
    return True


def same_value(a, b) -> bool:
    """Whether a param's recorded value is its value now: of the same type, and equal, NaN
    being the same as NaN (``.nan != .nan``: a stage with a NaN param was never up to date)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def _param_changes(recorded: Mapping, current: Mapping) -> list[str]:
    changes = []
    for key in sorted(set(recorded) | set(current)):
        if key not in recorded:
            changes.append(f"param {key} added ({shown(current[key])})")
        elif key not in current:
            changes.append(f"param {key} removed")
        elif not same_value(recorded[key], current[key]):
            # shown in bounded words: a hand-edited lock may hold anything, an alias bomb too
            changes.append(f"param {key} {shown(recorded[key])} -> {shown(current[key])}")
    return changes


def lock_name(stage: str) -> str:
    """A stage's name as one file name, one to one: a foreach key may be a path (``t@a/b``),
    and ``/`` is written ``%2F`` (it was ``--``, which ``t@a--b`` has too: the two stages
    shared one running-lock, and each refused while the other ran)."""
    return quote(stage, safe="@+")


class Pipeline:
    """The stages of one stages file, checked and run in ``workdir``.

    ``commands`` maps each capstack sub-command a stage may run to the module
    that implements it (whose source files are the stage's code version).
    """

    def __init__(self, stages_file: StagesFile, workdir: str | os.PathLike,
                 commands: Mapping[str, str], outs_outside_workdir: bool = False):
        self.file = stages_file
        self.workdir = Path(workdir).resolve()
        self.commands = dict(commands)
        self.outs_outside_workdir = outs_outside_workdir
        self.state_dir = self.workdir / ".capstack"
        self.lock_path = self.workdir / f"{stages_file.path.stem}.lock"
        self._hashes = HashCache(self.state_dir / "hashes.sqlite")

    # -- the record of past runs --------------------------------------------------------
    def _read_lock(self) -> dict:
        """The stages' records; a damaged lock file is set aside (never deleted), said, and
        read as empty: every stage then counts as never run."""
        try:
            text = read_text(self.lock_path, "the stages' lock file")
        except FileNotFoundError:
            return {}
        except UnicodeDecodeError:
            return self._set_aside_damaged_lock("not UTF-8 text")
        try:
            data = yaml.load(text, Loader=_Loader) or {}
        except yaml.YAMLError as e:
            return self._set_aside_damaged_lock(f"not valid YAML: {getattr(e, 'problem', e)}")
        except RecursionError:
            return self._set_aside_damaged_lock("nested too deeply to be a lock file")
        stages = data.get("stages", {}) if isinstance(data, dict) else None
        if not _is_lock_records(stages):
            return self._set_aside_damaged_lock("not a mapping of stages to their records")
        return stages

    def _set_aside_damaged_lock(self, problem: str) -> dict:
        kept = unused_sibling(self.lock_path, ".damaged")
        with suppress(FileNotFoundError):  # another process set it aside first
            os.replace(self.lock_path, kept)
            log.warning("%s: damaged lock file (%s); moved to %s, and every stage counts as "
                        "never run", self.lock_path, problem, kept)
        return {}

    def _write_lock_entry(self, name: str, entry: dict) -> None:
        with waiting_lock(self.state_dir / "lockfile.flock"):
            stages = self._read_lock()
            stages[name] = entry
            with atomic_file(self.lock_path) as tmp:
                tmp.write_text(yaml.dump({"schema": LOCK_SCHEMA, "stages": stages},
                                         Dumper=_Dumper, sort_keys=False))

    # -- digests ------------------------------------------------------------------------
    def _path(self, p: str) -> Path:
        return self.workdir / p

    def _code_digest(self, stage: Stage) -> dict[str, str]:
        """A capstack command's source files and their md5, and the installed version of each
        distribution they name in ``CODE_DISTRIBUTIONS`` (codeversion.py); {} for another
        program (its code is tracked through the deps the stage declares)."""
        if not stage.command:
            return {}
        root = project_root()
        module = self.commands[stage.command]
        return {**{str(f.relative_to(root) if f.is_relative_to(root) else f):
                   self._hashes.derived(f, "code", code_digest) for f in code_files(module)},
                **distribution_versions(code_distributions(module))}

    def _deps(self, stage: Stage) -> tuple[str, ...]:
        """The stage's deps, and the files its YAML deps extend (``extends: OTHER.yaml``,
        followed to the end of the chain): a variant's training is stale when the experiment
        it extends changes, as when the variant itself does. Each is named from the workdir
        when it lies inside it."""
        found = list(stage.deps)
        for dep in stage.deps:
            for path in extends_chain(self._path(dep)):
                name = str(path.relative_to(self.workdir)) if path.is_relative_to(self.workdir) \
                    else str(path)
                if name not in found:
                    found.append(name)
        return tuple(found)

    def _digests(self, paths: Iterable[str]) -> dict[str, dict | None]:
        out = {}
        for p in paths:
            d = self._hashes.digest(self._path(p))
            out[p] = d.to_dict() if d else None
        return out

    # -- deciding -----------------------------------------------------------------------
    def own_status(self, stage: Stage, record: Mapping | None = None) -> StageStatus:
        """Status from the stage's own record, ignoring upstream stages."""
        if record is None:
            record = self._read_lock().get(stage.name)
        if not record:
            return StageStatus(stage.name, NEVER_RUN)
        reasons = []
        # a param's new value is no cmd change; the same words with(out) a shell are one
        if record.get("cmd") != stage.cmd_template or record.get("shell", False) != stage.shell:
            reasons.append("cmd changed")
        reasons += _param_changes(record.get("params") or {}, stage.params)
        if stage.command and record.get("code_rule") != CODE_RULE:
            reasons.append("code version recorded by an older capstack, which did not follow "
                           "registries")
        else:
            reasons += self._code_changes(record.get("code") or {}, self._code_digest(stage))
        reasons += self._path_changes("dep", record.get("deps") or {}, self._deps(stage),
                                      "changed")
        reasons += self._path_changes("out", record.get("outs") or {}, stage.outs, "modified")
        self._hashes.save()
        return StageStatus(stage.name, STALE if reasons else UP_TO_DATE, tuple(reasons))

    @staticmethod
    def _code_changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
        changed = sorted(f for f in set(recorded) | set(current)
                         if recorded.get(f) != current.get(f))
        if not changed:
            return []
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return [f"code changed: {', '.join(changed[:3])}{more}"]

    def _path_changes(self, kind: str, recorded: Mapping, paths: tuple[str, ...],
                      verb: str) -> list[str]:
        reasons = []
        for p in sorted(set(recorded) - set(paths)):
            reasons.append(f"{kind} {p} removed")
        for p, now in self._digests(paths).items():
            if now is None:
                reasons.append(f"{kind} {p} missing")
            elif p not in recorded:
                reasons.append(f"{kind} {p} added")
            elif (recorded[p] or {}).get("md5") != now["md5"]:
                reasons.append(f"{kind} {p} {verb}")
            elif (target := target_of(self._path(p))) is not None and not target.exists():
                reasons.append(f"{kind} {p} points to {target}, which is gone")
        return reasons

    def records(self) -> dict:
        """The record of each stage's last run (the lock file's entries), by stage name."""
        return self._read_lock()

    def statuses(self) -> dict[str, StageStatus]:
        """Every stage's status, in run order; a stage behind a stale one is stale too."""
        records = self.records()
        result: dict[str, StageStatus] = {}
        for name in self.file.order:
            st = self.own_status(self.file.stage(name), records.get(name))
            behind = [u for u in self.file.upstream[name] if not result[u].up_to_date]
            if st.up_to_date and behind:
                st = StageStatus(name, STALE, tuple(
                    f"upstream stage {u} is {result[u].state}" for u in behind))
            result[name] = st
        return result

    def demo_stages(self) -> list[str]:
        """What ``capstack demo`` runs, in run order: the file's ``demo:`` stages and every stage
        they need; every stage when the file names none."""
        if not self.file.demo:
            return list(self.file.order)
        needed = set(self.file.demo).union(*(self.upstream_closure(t) for t in self.file.demo))
        return [s for s in self.file.order if s in needed]

    def upstream_closure(self, name: str) -> list[str]:
        """Stages ``name`` depends on, directly or not, in run order."""
        return self.file.upstream_closure(name)

    # -- running ------------------------------------------------------------------------
    def run(self, name: str, *, force: bool = False, with_deps: bool = False,
            assignments: Iterable[str] = (), report: Callable[[str], None] = lambda m: None
            ) -> list[str]:
        """Run stage ``name`` (and, with ``with_deps``, the upstream stages it needs).

        Returns the names of the stages that actually ran.
        """
        stage = self.file.with_overrides(name, assignments)
        upstream = self.upstream_closure(name)
        if upstream:
            states = self.statuses()
            behind = [u for u in upstream if not states[u].up_to_date]
            if behind and not with_deps:
                u = behind[0]
                raise CapstackError(
                    f"stage '{name}' needs stage '{u}', which is {states[u].describe()}; "
                    f"run `{self.run_hint(u)}` first, or add --with-deps"
                )
            upstream = behind
        ran = [u for u in upstream if self.run_stage(self.file.stage(u), False, report)]
        if self.run_stage(stage, force, report):
            ran.append(name)
        return ran

    def run_hint(self, name: str) -> str:
        """The command that runs stage ``name`` from the current folder, with ``-c`` and
        ``--workdir`` where they are not the defaults (``capstack run extract_grid -c
        configs/coco.yaml``): what a message tells the user to type."""
        here = Path.cwd().resolve()
        words = ["capstack", "run", name]
        if self.file.path.resolve() != here / "stages.yaml":
            words += ["-c", _as_typed(self.file.path, here)]
        if self.workdir != here:
            words += ["--workdir", _as_typed(self.workdir, here)]
        return shlex.join(words)

    def makers_of(self, path: str) -> list[str]:
        """The stages of this file whose outs hold ``path`` (or lie inside it)."""
        return [name for name in self.file.order
                if any(_overlaps(path, out) for out in self.file.stage(name).outs)]

    def run_all(self, report: Callable[[str], None] = lambda m: None) -> list[str]:
        """Every stage in order, each skipped when up to date."""
        return [n for n in self.file.order if self.run_stage(self.file.stage(n), False, report)]

    def run_stage(self, stage: Stage, force: bool, report: Callable[[str], None]) -> bool:
        """Run ``stage`` when it is not up to date (or ``force``), from a clean start: its
        outs are set aside first (:meth:`_set_aside_outs`), unless they are what a run of this
        very stage left when it was interrupted (:meth:`_resumes`), which its command resumes.
        Its cmd gets the names the engine gives (:meth:`builtins`)."""
        stage = with_given(stage, self.builtins())
        holder = self.run_lock(stage.name)
        with exclusive_run(holder, f"stage '{stage.name}' of {self.file.path}") as lock:
            status = self.own_status(stage)
            if status.up_to_date and not force:
                report(f"Stage '{stage.name}' is up to date, skipping.")
                return False
            why = "forced" if status.up_to_date else status.describe()
            report(f"Running stage '{stage.name}' ({why}): {stage.cmd}")
            self._check_outs_inside(stage)
            attempt = self._attempt(stage)
            if not force and self._resumes(stage, attempt):
                report(f"Stage '{stage.name}': resuming its interrupted run (the same cmd, "
                       f"params, code and deps)")
                set_aside = {}
            else:
                set_aside = self._set_aside_outs(stage, report)
            self._write_attempt(stage, attempt)
            self._execute(stage, lock)
            self._attempt_path(stage).unlink(missing_ok=True)
            self._drop_unchanged(set_aside, report)
            return True

    def run_lock(self, name: str) -> Path:
        """The lock a run of stage ``name`` holds while it runs: held, the stage is running."""
        return self.state_dir / "running" / f"{self.file.path.stem}.{lock_name(name)}.pid"

    # -- a run's clean start ------------------------------------------------------------
    # A stage that runs because it is stale or forced computes its outs afresh, as dvc does
    # (it removes them; capstack sets them aside): a command that finds its outs complete
    # (a training's last.pt at its last epoch, a store already full) would otherwise do
    # nothing, and the engine would record what it did not make as up to date. The one
    # exception is a run of the same stage interrupted with the same cmd, params, code and
    # deps: its outs are that run's, half made, and its command resumes them. The record of a
    # run as it starts (its "attempt") tells the two apart.
    def _named(self, path: Path) -> str:
        """``path`` (under the workdir, links not followed) as the stages file names it."""
        return str(path.relative_to(self.workdir)) if path.is_relative_to(self.workdir) \
            else str(path)

    def _attempt_path(self, stage: Stage) -> Path:
        return self.state_dir / "attempts" / f"{self.file.path.stem}.{lock_name(stage.name)}.yaml"

    def _attempt(self, stage: Stage) -> dict:
        """What a run of ``stage`` starting now is made of: its cmd, params, code and deps."""
        return {"cmd": stage.cmd_template, "shell": stage.shell, "params": stage.params,
                "code": self._code_digest(stage),
                "deps": {p: d and d["md5"] for p, d in self._digests(self._deps(stage)).items()}}

    def _write_attempt(self, stage: Stage, attempt: dict) -> None:
        path = self._attempt_path(stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as tmp:
            tmp.write_text(yaml.dump(attempt, Dumper=_Dumper, sort_keys=False))

    def _resumes(self, stage: Stage, attempt: dict) -> bool:
        """Whether the stage's outs are those of its run interrupted with ``attempt``'s very
        cmd, params, code and deps (a damaged or unreadable record is no such run)."""
        try:
            text = read_text(self._attempt_path(stage), "a stage's attempt record")
            recorded = yaml.load(text, Loader=_Loader)
        except FileNotFoundError:
            return False
        except (OSError, CapstackError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
            return False
        return isinstance(recorded, dict) and same_value(recorded, attempt)

    def _set_aside_outs(self, stage: Stage, report: Callable[[str], None]) -> dict[Path, Path]:
        """Move each existing out to ``<out>.old`` (``.old.2``, ... when taken): never deleted.
        An out whose lock (``<out>.lock``: a training or an extraction writing it) is held
        is refused, naming the holder. Returns each out's new place, by out."""
        moved = {}
        for out in stage.outs:
            path = self._path(out)
            if not (path.exists() or path.is_symlink()):
                continue
            if lock_beside(path).is_file():
                try:
                    with exclusive_beside(path, f"a write of {out}"):
                        pass
                except CapstackError as error:
                    raise CapstackError(f"stage '{stage.name}': its out {out} cannot be set "
                                        f"aside: {error}") from None
            kept = unused_sibling(path, ".old")
            os.replace(path, kept)
            report(f"Stage '{stage.name}': {out} set aside as {self._named(kept)} "
                   f"(a stage that runs computes its outs afresh)")
            moved[path] = kept
        return moved

    def _drop_unchanged(self, set_aside: Mapping[Path, Path], report: Callable[[str], None]
                        ) -> None:
        """Remove a set-aside out that the run made again byte for byte: nothing is lost, and
        a rerun that changes nothing (a feature pointer, a deterministic prepare) leaves no
        copy behind."""
        for path, kept in set_aside.items():
            old, new = self._hashes.digest(kept), self._hashes.digest(path)
            if old is None or new is None or old.md5 != new.md5 or kept.is_symlink() \
                    or path.is_symlink():
                continue
            if kept.is_dir():
                shutil.rmtree(kept)
            else:
                kept.unlink()
            report(f"{self._named(path)} was made again byte for byte: its copy "
                   f"{self._named(kept)} removed")

    def _check_outs_inside(self, stage: Stage) -> None:
        """Refuse an out outside the workdir (``../x``, ``/abs``, ``a/../..``) unless the user
        opted in: a careless path would otherwise be written, and later replaced, wherever it
        points. An out naming the workdir itself (``.``, ``runs/..``) is always refused."""
        paths = [(o, os.path.normpath(o)) for o in stage.outs]
        itself = [o for o, norm in paths if norm == os.curdir]
        if itself:
            raise CapstackError(
                f"{self.file.path}: stages.{stage.name}.outs: '{itself[0]}' is the workdir "
                f"{self.workdir} itself; an out is a file or a folder inside it")
        outside = [o for o, norm in paths if os.path.isabs(norm) or norm == os.pardir
                   or norm.startswith(os.pardir + os.sep)]
        if outside and not self.outs_outside_workdir:
            raise CapstackError(
                f"{self.file.path}: stages.{stage.name}.outs: '{outside[0]}' is outside the "
                f"workdir {self.workdir}; outs are written inside it unless you pass "
                f"--outs-outside-workdir")

    def _missing_deps(self, stage: Stage, deps: Mapping[str, dict | None]) -> list[str]:
        """The stage's deps that do not exist. One that a stage of the file makes is refused
        with the command that makes it. One that no stage makes is an input the user provides
        (weights, a dataset): a capstack command still runs, since its own check names the
        file and where it comes from, which the engine cannot; another program's is refused."""
        missing = [p for p, d in deps.items() if d is None]
        for dep in missing:
            makers = self.makers_of(dep)
            if makers:
                raise CapstackError(f"stage '{stage.name}': dep {dep} does not exist (in "
                                    f"{self.workdir}); stage '{makers[0]}' makes it: run "
                                    f"`{self.run_hint(makers[0])}` first, or add --with-deps")
        if missing and not stage.command:
            raise CapstackError(f"stage '{stage.name}': dep {missing[0]} does not exist (in "
                                f"{self.workdir}), and no stage of {self.file.path} makes it")
        return missing

    def _execute(self, stage: Stage, lock: int) -> None:
        """Run the stage's command through a keeper (keeper.py) holding the stage's ``lock``:
        the command's processes end with this one, stopped or killed, and the lock holds
        until they have."""
        self._check_outs_inside(stage)
        deps = self._digests(self._deps(stage))
        missing = self._missing_deps(stage, deps)
        code = self._code_digest(stage)
        env = {**os.environ, "CAPSTACK_STAGE": f"{self.file.path.resolve()}:{stage.name}"}
        if stage.command:
            argv = capstack_command(stage.argv)
            executable = argv[0]
            if stage.nproc > 1:  # the command's --nproc: it launches torchrun itself
                env["CAPSTACK_NPROC"] = str(stage.nproc)
        else:  # run as found now, whatever the child's PATH or folder would find
            argv, executable = list(stage.argv), self._find_program(stage, env)
        started = time.time()
        try:
            rc = run_kept(argv, executable=executable, cwd=self.workdir, env=env,
                          pass_fds=(lock,))
        except OSError as e:  # found, but not something this machine can start
            raise CapstackError(f"{self.file.path}: stages.{stage.name}.cmd: cannot run program "
                                f"'{stage.program}': {e.strerror or e}") from None
        lacking = f" (its dep {missing[0]} does not exist)" if missing else ""
        if rc != 0:
            raise CapstackError(f"stage '{stage.name}' failed: `{stage.cmd}` "
                                f"{self._how_it_ended(stage, rc)}{lacking}; nothing was recorded")
        if missing:
            raise CapstackError(f"stage '{stage.name}': `{stage.cmd}` succeeded, but its dep "
                                f"{missing[0]} does not exist (in {self.workdir}), and no stage "
                                f"of {self.file.path} makes it; nothing was recorded")
        outs = self._digests(stage.outs)
        absent = [p for p, d in outs.items() if d is None]
        if absent:
            raise CapstackError(f"stage '{stage.name}': `{stage.cmd}` succeeded but did not "
                                f"write its out {absent[0]}")
        self._hashes.save()
        self._write_lock_entry(stage.name, {
            "cmd": stage.cmd_template,
            **({"shell": True} if stage.shell else {}),
            "ran": stage.cmd,
            "params": stage.params,
            "code": code,
            **({"code_rule": CODE_RULE} if stage.command else {}),
            "deps": deps,
            "outs": outs,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "duration_s": round(time.time() - started, 3),
        })

    def builtins(self) -> dict[str, str]:
        """What the names the engine gives a stage's cmd (stagedecl.BUILTINS) are here:
        ``${experiment}``, the experiment a stage runs in, "" for the baseline's."""
        return {"experiment": ""}

    def _find_program(self, stage: Stage, env: Mapping[str, str]) -> str:
        """The absolute path of the program a stage starts: a path (one with a ``/``) from the
        workdir, a bare name on PATH, as a shell finds it; a CapstackError when there is none."""
        program = stage.program
        if os.sep in program:
            path = self.workdir / program  # an absolute program stays itself
            found = str(path) if path.is_file() else None
            where = "" if os.path.isabs(program) else f" (in {self.workdir})"
        else:
            found = shutil.which(program, path=env.get("PATH", os.defpath))
            where = " (on PATH)"
        if found is None:
            raise CapstackError(f"{self.file.path}: stages.{stage.name}.cmd: program "
                                f"'{program}' not found{where}")
        return os.path.abspath(found)

    @staticmethod
    def _how_it_ended(stage: Stage, rc: int) -> str:
        if rc < 0:
            with suppress(ValueError):
                return f"was stopped by signal {signal.Signals(-rc).name}"
            return f"was stopped by signal {-rc}"
        if stage.shell and rc == 127:
            return "exited with status 127 (the shell found no such command)"
        return f"exited with status {rc}"
