"""What one stage of a stages file declares, as read and checked: its ``cmd``, ``deps``,
``outs``, ``params``, ``metrics`` and the rest (stagefile.py reads the file; interpolation.py
resolves the ``${...}`` of each stage this returns).

Every problem is a CapstackError ``FILE: FIELD: problem``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.errors import CapstackError

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a param's or a var's name
# @key: a foreach key, which may be a relative path (train@stack_cap/top_down) and name a
# variant with + (train@stack_cap/variants/top_down+feature_embed)
STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*)?$")
LOOP_KEYS = {"foreach", "do"}
STAGE_KEYS = {"desc", "cmd", "deps", "outs", "params", "metrics", "nproc", "when", "shell"}
METRICS_KEYS = {"path", "show", "percent"}
SHELL = "/bin/sh"  # what runs the cmd of a stage with ``shell: true``, as ``/bin/sh -c CMD``
WHEN = re.compile(r"^(not\s+)?(?!not$)([A-Za-z_][A-Za-z0-9_.]*)$")
_SCALARS = (str, int, float, bool)
# Names the engine gives a stage's cmd when it runs it, not params: ``${experiment}`` is the
# experiment the stage runs in (its group, what the report calls its rows; "" for the
# baseline's). Never recorded, so where a stage runs never makes it stale.
BUILTINS = ("experiment",)


@dataclass(frozen=True)
class MetricsFile:
    """A ``metrics:`` entry: a file the stage writes (inside one of its outs) whose numbers
    ``capstack exp show`` and ``exp diff`` read. ``show``: the values shown, each a key of the
    file (``metrics.CIDEr``: a dot goes into a mapping), the column named by its last part;
    empty: every number at the top level of the file. ``percent``: shown times 100."""

    path: str
    show: tuple[str, ...] = ()
    percent: bool = False


@dataclass(frozen=True)
class Stage:
    """One stage with every ``${param}`` resolved (a built-in's ``${NAME}`` is filled when the
    stage runs: interpolation.with_given)."""

    name: str
    desc: str
    cmd: str
    cmd_template: str  # as written, before ${param} substitution
    # what runs: a capstack command's words after "capstack"; another program's words, the
    # program first; with ``shell``, ("/bin/sh", "-c", cmd)
    argv: tuple[str, ...]
    command: str  # the capstack sub-command it runs; "" for another program
    deps: tuple[str, ...]
    outs: tuple[str, ...]
    params: dict[str, Any]  # every param the stage uses, by name
    nproc: int = 1  # processes its command runs as (torchrun); not part of what it computes
    shell: bool = False  # cmd run by /bin/sh -c (then never a capstack command of its own)
    metrics: tuple[MetricsFile, ...] = ()  # the files of numbers exp show reads
    given: tuple[str, ...] = ()  # the BUILTINS its cmd uses, filled when it runs

    @property
    def program(self) -> str:
        """The program the stage starts ("capstack" for a capstack command)."""
        return "capstack" if self.command else self.argv[0]


@dataclass(frozen=True)
class StageTemplate:
    """One stage as written in the file, before ``${param}`` substitution."""

    name: str
    desc: str
    cmd: str
    deps: tuple[str, ...]
    outs: tuple[str, ...]
    params: dict[str, Any]
    loop: dict[str, Any] = field(default_factory=dict)  # ${key}, ${item.NAME} of a foreach
    nproc: int = 1
    when: str = ""  # "NAME" or "not NAME": the stage exists only while that holds
    shell: bool = False
    metrics: tuple[MetricsFile, ...] = ()


def refuse_unknown_keys(path: Path, where: str, body: dict, allowed: set[str],
                        beside: str = "") -> None:
    """``FILE: WHERE.KEY: unknown key (allowed: ...)`` for the first key not in ``allowed``."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        at = f"{where}.{unknown[0]}" if where else unknown[0]
        raise CapstackError(f"{path}: {at}: unknown key{beside} "
                            f"(allowed: {', '.join(sorted(allowed))})")


def type_name(value: Any) -> str:
    return type(value).__name__


def refuse_builtin(path: Path, where: str, name: str) -> None:
    """A param or a var may not take a name the engine gives (:data:`BUILTINS`)."""
    if name in BUILTINS:
        raise CapstackError(f"{path}: {where}: '{name}' is a name the engine gives a stage's "
                            f"cmd (${{{name}}}: the experiment it runs in), not a param; "
                            f"choose another name")


def check_params(path: Path, where: str, params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise CapstackError(f"{path}: {where}: expected a mapping of names to values")
    for key, value in params.items():
        if not isinstance(key, str) or not NAME.match(key):
            raise CapstackError(f"{path}: {where}: invalid param name {key!r}")
        refuse_builtin(path, f"{where}.{key}", key)
        if value is None or not isinstance(value, _SCALARS):
            raise CapstackError(
                f"{path}: {where}.{key}: expected a string, number or boolean, "
                f"got {type_name(value)}"
            )
    return dict(params)


def check_str_list(path: Path, where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CapstackError(f"{path}: {where}: expected a list of paths")
    return tuple(value)


def check_metrics(path: Path, where: str, value: Any) -> tuple[MetricsFile, ...]:
    """``metrics:``: a list, each a path or ``{path: P, show: [KEY, ...], percent: BOOL}``."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise CapstackError(f"{path}: {where}: expected a list of metrics files, each a path "
                            f"or {{path: FILE, show: [KEY, ...], percent: true}}")
    entries = []
    for k, entry in enumerate(value):
        at = f"{where}[{k}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict):
            raise CapstackError(f"{path}: {at}: expected a path or {{path: FILE, show: "
                                f"[KEY, ...], percent: true}}, got {type_name(entry)}")
        refuse_unknown_keys(path, at, entry, METRICS_KEYS)
        file = entry.get("path")
        if not isinstance(file, str) or not file.strip():
            raise CapstackError(f"{path}: {at}.path: missing (the file of numbers, inside one "
                                f"of the stage's outs)")
        show = entry.get("show", [])
        if not isinstance(show, list) or not all(isinstance(s, str) and s.strip()
                                                 for s in show):
            raise CapstackError(f"{path}: {at}.show: expected a list of the file's keys "
                                f"(metrics.CIDEr: a dot goes into a mapping)")
        columns = [column_of(s) for s in show]
        twice = next((c for c in columns if columns.count(c) > 1), None)
        if twice is not None:
            raise CapstackError(f"{path}: {at}.show: two keys make the column '{twice}' (a "
                                f"column is named by the key's last part)")
        percent = entry.get("percent", False)
        if not isinstance(percent, bool):
            raise CapstackError(f"{path}: {at}.percent: expected true or false, got "
                                f"{percent!r}")
        entries.append(MetricsFile(file, tuple(show), percent))
    return tuple(entries)


def column_of(key: str) -> str:
    """The column a ``show`` key is shown in: its last dotted part (``metrics.CIDEr``: CIDEr)."""
    return key.rsplit(".", 1)[-1]


def check_stage(path: Path, name: Any, body: Any) -> StageTemplate:
    where = f"stages.{name}"
    if not isinstance(name, str) or not STAGE_NAME.match(name):
        raise CapstackError(f"{path}: {where}: invalid stage name")
    if not isinstance(body, dict):
        raise CapstackError(f"{path}: {where}: expected a mapping with a 'cmd'")
    refuse_unknown_keys(path, where, body, STAGE_KEYS)
    cmd = body.get("cmd")
    if not isinstance(cmd, str) or not cmd.strip():
        raise CapstackError(f"{path}: {where}.cmd: missing (the command the stage runs)")
    desc = body.get("desc", "")
    if not isinstance(desc, str):
        raise CapstackError(f"{path}: {where}.desc: expected a string")
    nproc = body.get("nproc", 1)
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise CapstackError(f"{path}: {where}.nproc: expected a positive number of processes, "
                            f"got {nproc!r}")
    shell = body.get("shell", False)
    if not isinstance(shell, bool):
        raise CapstackError(f"{path}: {where}.shell: expected true or false, got {shell!r}")
    when = body.get("when", "")
    if not isinstance(when, str) or (when and not WHEN.match(when.strip())):
        raise CapstackError(f"{path}: {where}.when: expected NAME or 'not NAME' of a param, "
                            f"got {when!r}")
    return StageTemplate(
        name=name,
        desc=desc,
        cmd=cmd,
        deps=check_str_list(path, f"{where}.deps", body.get("deps")),
        outs=check_str_list(path, f"{where}.outs", body.get("outs")),
        params=check_params(path, f"{where}.params", body.get("params") or {}),
        nproc=nproc,
        when=when.strip(),
        shell=shell,
        metrics=check_metrics(path, f"{where}.metrics", body.get("metrics")),
    )


def off_because(path: Path, t: StageTemplate, lookup: Mapping[str, Any]) -> str:
    """Why the stage is off ("" when it is on): its ``when`` does not hold."""
    if not t.when:
        return ""
    match = WHEN.match(t.when)
    assert match is not None, "a stage's when was checked when it was read"
    negated, name = match.groups()
    if name not in lookup:
        raise CapstackError(f"{path}: stages.{t.name}.when: unknown param {name!r} "
                            f"(params: {', '.join(sorted(lookup)) or 'none'})")
    value = lookup[name]
    is_set = value not in (None, "", False, 0)
    if is_set == (not negated):
        return ""
    return f"when: {t.when}, and {name} is {'set' if is_set else 'not set'}"
