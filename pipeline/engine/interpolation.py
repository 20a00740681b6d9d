"""What a stages file's ``${...}`` become: its ``vars`` spread into the words that name them,
its ``foreach`` entries expanded into stages, and each stage's ``${param}`` resolved into the
words it runs (stagefile.py's docstring says what a user writes). A name the engine gives
(stagedecl.BUILTINS: ``${experiment}``) is left in the cmd until the stage runs
(:func:`with_given`), and never recorded as a param.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from pipeline.core.errors import CapstackError, shown
from pipeline.engine.stagedecl import (BUILTINS, LOOP_KEYS, NAME, SHELL, STAGE_NAME, Stage,
                                       StageTemplate, check_params, check_stage,
                                       refuse_builtin, refuse_unknown_keys)

_PARAM_REF = re.compile(r"\$\{([^}]*)\}")
_VAR_REF = re.compile(r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}")
_GIVEN_REF = re.compile(r"\$\{(" + "|".join(BUILTINS) + r")\}")  # as resolve leaves them


# -- vars --------------------------------------------------------------------------------
def check_vars(path: Path, raw: Any, shared: Mapping[str, Any]) -> dict[str, dict]:
    """``vars``: name -> a list of keys, or a mapping of keys to values (as a foreach takes)."""
    if not isinstance(raw, dict):
        raise CapstackError(f"{path}: vars: expected a mapping of names to lists")
    out = {}
    for name, value in raw.items():
        where = f"vars.{name}"
        if not isinstance(name, str) or not NAME.match(name):
            raise CapstackError(f"{path}: vars: invalid name {name!r}")
        refuse_builtin(path, where, name)
        if name in shared:
            raise CapstackError(f"{path}: {where}: also a param; a name is one or the other")
        if isinstance(value, list):
            value = {item: {} for item in value}
        if not isinstance(value, dict) or not value or not all(
                isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
            raise CapstackError(f"{path}: {where}: expected a non-empty list of keys or a "
                                f"mapping of keys to values")
        out[name] = {str(k): check_params(path, f"{where}.{k}", v or {})
                     for k, v in value.items()}
    return out


# Bounds on what vars and foreach make of a stages file (the demo's: 59 stages, 825 words; the
# COCO replication's: 95 stages, 1,291 words): past them a file of a few hundred bytes would
# make one command of millions of words, or tens of thousands of stages.
MAX_STAGES = 2_000
MAX_WORDS = 100_000  # words of the cmds, deps and outs of every stage together


class Size:
    """The stages and words a stages file makes so far, refused past the bounds before the
    entry that passes them is expanded into its stages."""

    def __init__(self, path: Path):
        self.path, self.stages, self.words = path, 0, 0

    def add(self, name: Any, body: Any) -> None:
        loop = body.get("foreach") if isinstance(body, dict) else None
        inner = body.get("do") if loop is not None else body
        stages = len(loop) if isinstance(loop, (dict, list)) else 1
        words = _words_of(inner) if isinstance(inner, dict) else 0
        self.stages += stages
        self.words += stages * words
        if self.stages > MAX_STAGES:
            raise CapstackError(f"{self.path}: stages.{name}: makes the file's stages more than "
                                f"{MAX_STAGES} once its foreach entries are expanded; a stages "
                                f"file is far smaller")
        if self.words > MAX_WORDS:
            raise CapstackError(f"{self.path}: stages.{name}: makes the cmds, deps and outs of "
                                f"the file's stages more than {MAX_WORDS} words once its vars "
                                f"and foreach entries are expanded; a stages file is far "
                                f"smaller")


def _words_of(stage: dict) -> int:
    cmd, deps, outs = stage.get("cmd"), stage.get("deps"), stage.get("outs")
    return (len(cmd.split()) if isinstance(cmd, str) else 0) + \
        sum(len(v) for v in (deps, outs) if isinstance(v, list))


def with_vars(path: Path, where: str, body: Any, lists: Mapping[str, dict]) -> Any:
    """The stage entry with its var references expanded: ``foreach: ${NAME}`` as the var's
    mapping, and each word of a foreach list, cmd, deps or outs holding ``${NAME}`` as one
    word per key of the var (what surrounds the reference added to each). How many words a
    list or a cmd becomes is counted first, and refused past :data:`MAX_WORDS`."""
    if not lists or not isinstance(body, dict):
        return body
    body = dict(body)
    loop = body.get("foreach")
    if isinstance(loop, str) and (whole := _VAR_REF.fullmatch(loop.strip())) \
            and whole.group(1) in lists:
        body["foreach"] = lists[whole.group(1)]
    elif isinstance(loop, list):
        words = [str(item) for item in loop]
        _check_spread(path, f"{where}.foreach", words, lists)
        body["foreach"] = [w for item in words for w in _spread(item, lists)]
    inner = dict(body["do"]) if isinstance(body.get("do"), dict) else body
    if isinstance(inner.get("cmd"), str):
        words = inner["cmd"].split(" ")
        _check_spread(path, f"{where}.cmd", words, lists)
        inner["cmd"] = " ".join(w for word in words for w in _spread(word, lists))
    for key in ("deps", "outs"):
        if isinstance(inner.get(key), list):
            _check_spread(path, f"{where}.{key}",
                          [item for item in inner[key] if isinstance(item, str)], lists)
            inner[key] = [w for item in inner[key] for w in
                          (_spread(item, lists) if isinstance(item, str) else [item])]
    if inner is not body:
        body["do"] = inner
    return body


def _check_spread(path: Path, where: str, words: list[str], lists: Mapping[str, dict]) -> None:
    """Refuse ``words`` that their var references would make more than :data:`MAX_WORDS`
    (each reference in a word multiplies it by its var's keys), before any is made."""
    total = 0
    for word in words:
        made = 1
        for m in _VAR_REF.finditer(word):
            made *= len(lists.get(m.group(1), ())) or 1
        total += made
        if total > MAX_WORDS:
            raise CapstackError(f"{path}: {where}: its vars make it more than {MAX_WORDS} "
                                f"words (each ${{NAME}} in a word makes one word per key of "
                                f"NAME, two in one word every pair); a stages file is far "
                                f"smaller")


def _spread(word: str, lists: Mapping[str, dict]) -> list[str]:
    """``word``, or one word per key of each var it references (every combination, the first
    reference's keys outermost)."""
    pieces: list[Iterable[str]] = []
    last = 0
    for m in _VAR_REF.finditer(word):
        if m.group(1) in lists:
            pieces += [(word[last:m.start()],), lists[m.group(1)]]
            last = m.end()
    pieces.append((word[last:],))
    return ["".join(combination) for combination in itertools.product(*pieces)]


# -- foreach -----------------------------------------------------------------------------
def expand(path: Path, name: Any, body: Any) -> list[StageTemplate]:
    """One stage, or the ``name@key`` stages of a ``foreach``/``do`` entry."""
    if not isinstance(body, dict) or "foreach" not in body:
        return [check_stage(path, name, body)]
    where = f"stages.{name}"
    if not isinstance(name, str) or not STAGE_NAME.match(name):
        raise CapstackError(f"{path}: {where}: invalid stage name")
    refuse_unknown_keys(path, where, body, LOOP_KEYS, beside=" next to foreach")
    items = body["foreach"]
    if isinstance(items, list):
        items = {str(item): {} for item in items}
    if not isinstance(items, dict) or not items:
        raise CapstackError(f"{path}: {where}.foreach: expected a non-empty list of keys or a "
                            f"mapping of keys to values")
    templates = []
    for key, values in items.items():
        if any(part in (".", "..") for part in str(key).split("/")):
            # runs/${key} with key '..' named the workdir itself as the stage's out
            raise CapstackError(f"{path}: {where}.foreach: key {shown(str(key))}: a key names a "
                                f"stage, and may be a path below the workdir (a/b), never with "
                                f"a '.' or '..' part")
        values = check_params(path, f"{where}.foreach.{key}", values or {})
        template = check_stage(path, f"{name}@{key}", body.get("do"))
        loop = {"key": str(key), **{f"item.{k}": v for k, v in values.items()}}
        # an entry's own params may name its key and items: config: configs/${key}.yaml
        params = {k: substitute(path, f"{where}.do.params.{k}", v, loop, {}, False)
                  if isinstance(v, str) else v for k, v in template.params.items()}
        templates.append(replace(template, loop=loop, params=params))
    return templates


# -- resolving ${params} -----------------------------------------------------------------
def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def substitute(path: Path, where: str, text: str, lookup: Mapping[str, Any], used: dict,
               quote: bool, given: list[str] | None = None) -> str:
    """``text`` with each ``${NAME}`` replaced by its value in ``lookup`` (recorded in
    ``used``; quoted as one word with ``quote``). A built-in's is left as ``${NAME}`` and
    noted in ``given`` where the engine gives it (a cmd), refused elsewhere."""
    def value_of(match: re.Match) -> str:
        key = match.group(1).strip()
        if key in BUILTINS:
            if given is None:
                raise CapstackError(f"{path}: {where}: ${{{key}}} is given to a stage's cmd "
                                    f"only (the experiment the stage runs in); its outs are "
                                    f"its experiment's already")
            given.append(key)
            return f"${{{key}}}"
        if key not in lookup:
            known = ", ".join(sorted(lookup)) or "none"
            raise CapstackError(f"{path}: {where}: unknown param ${{{key}}} (params: {known})")
        used[key] = lookup[key]
        rendered = _render(lookup[key])
        return shlex.quote(rendered) if quote else rendered

    return _PARAM_REF.sub(value_of, text)


def _normalise(p: str) -> str:
    return os.path.normpath(os.path.expanduser(p))


def _inside(p: str, out: str) -> bool:
    """Whether the normalised path ``p`` is ``out`` or lies inside it."""
    return p == out or p.startswith(out.rstrip(os.sep) + os.sep)


def resolve(path: Path, t: StageTemplate, shared: Mapping[str, Any], own: Mapping[str, Any],
            commands: frozenset, parallel: frozenset | None = None) -> Stage:
    where = f"stages.{t.name}"
    lookup = {**shared, **own, **t.loop}
    used: dict[str, Any] = {}
    given: list[str] = []
    # without a shell each param's value is one word; in a shell's cmd it is pasted as it is
    cmd = substitute(path, f"{where}.cmd", t.cmd, lookup, used, quote=not t.shell, given=given)
    deps = tuple(_normalise(substitute(path, f"{where}.deps", d, lookup, used, False))
                 for d in t.deps)
    outs = tuple(_normalise(substitute(path, f"{where}.outs", o, lookup, used, False))
                 for o in t.outs)
    metrics = tuple(replace(m, path=_normalise(substitute(path, f"{where}.metrics", m.path,
                                                          lookup, used, False)))
                    for m in t.metrics)
    for m in metrics:
        if not any(_inside(m.path, out) for out in outs):
            raise CapstackError(f"{path}: {where}.metrics: '{m.path}' lies in none of the "
                                f"stage's outs ({', '.join(outs) or 'none'}); a metrics file "
                                f"is one the stage writes")
    unused = sorted(set(own) - set(used))
    if unused:
        raise CapstackError(
            f"{path}: {where}.params.{unused[0]}: declared but not used in cmd, deps or outs"
        )
    params = dict(sorted(used.items()))
    command, argv = command_of(path, where, t, cmd, commands, parallel)
    return Stage(t.name, t.desc, cmd, t.cmd, argv, command, deps, outs, params, t.nproc,
                 t.shell, metrics, tuple(dict.fromkeys(given)))


def command_of(path: Path, where: str, t: StageTemplate, cmd: str, commands: frozenset,
               parallel: frozenset | None) -> tuple[str, tuple[str, ...]]:
    """The capstack sub-command the cmd runs ("" for another program) and the words to run."""
    argv: tuple[str, ...]
    if t.shell:
        command, argv = "", (SHELL, "-c", cmd)
    else:
        try:
            words = shlex.split(cmd)
        except ValueError as e:
            raise CapstackError(f"{path}: {where}.cmd: cannot split command ({e})") from None
        if not words or not words[0]:
            raise CapstackError(f"{path}: {where}.cmd: names no program once its params are "
                                f"substituted, got {cmd!r}")
        if words[0] != "capstack":
            command, argv = "", tuple(words)
        else:
            command, argv = (words[1] if len(words) > 1 else ""), tuple(words[1:])
            if command not in commands:
                what = f"unknown command 'capstack {command}'" if command else "no command"
                raise CapstackError(f"{path}: {where}.cmd: {what} "
                                    f"(stage commands: {', '.join(sorted(commands))})")
    if t.nproc > 1 and not command:
        raise CapstackError(f"{path}: {where}.nproc: is for capstack commands that take --nproc; "
                            f"another program starts its own processes")
    if t.nproc > 1 and parallel is not None and command not in parallel:
        raise CapstackError(f"{path}: {where}.nproc: 'capstack {command}' runs as one process "
                            f"(nproc is for: {', '.join(sorted(parallel))})")
    return command, argv


def with_given(stage: Stage, values: Mapping[str, str]) -> Stage:
    """``stage`` as it runs: each built-in ``${NAME}`` its cmd uses filled with ``values``
    (without a shell, one word each, as a param's value is; an empty one an empty word)."""
    if not stage.given:
        return stage

    def fill(text: str, quote: bool) -> str:
        return _GIVEN_REF.sub(lambda m: shlex.quote(values[m[1]]) if quote else values[m[1]],
                              text)

    if stage.shell:
        cmd = fill(stage.cmd, False)
        return replace(stage, cmd=cmd, argv=(SHELL, "-c", cmd))
    return replace(stage, cmd=fill(stage.cmd, True),
                   argv=tuple(fill(word, False) for word in stage.argv))
