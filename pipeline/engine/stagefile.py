"""Reading and validating a stages file (``stages.yaml``).

A stages file declares the pipeline as stages, each a command with the paths
it reads (``deps``), the paths it writes (``outs``) and the values it is run
with (``params``)::

    params:                      # shared values any stage may use
      data: data/shapes
    stages:
      prepare:
        desc: Karpathy json -> vocabulary, captions HDF5, references
        cmd: capstack prepare ${data}/dataset_shapes.json data/prepared --min-count ${min_count}
        params: {min_count: 5}
        deps: [${data}/dataset_shapes.json]
        outs: [data/prepared]

``${name}`` is replaced by the stage's own param, else by the shared one; a
stage's recorded params are its own plus the shared ones it uses.

A ``cmd`` starting with the word ``capstack`` runs that capstack command (one
a stage may run; its code version is tracked). Any other ``cmd`` runs that
program, split into words as a POSIX shell would but run without one: ``;``,
``|`` or ``$(...)`` are words passed to it, and a param's value is one word.
With ``shell: true`` the cmd, its params pasted in as they are (quoting is the
user's), runs as ``/bin/sh -c CMD``::

      count:
        cmd: python scripts/count.py ${data}/dataset_shapes.json counts.txt
        deps: [scripts/count.py, ${data}/dataset_shapes.json]   # its code: a dep
        outs: [counts.txt]

One entry can declare a family of stages, as DVC's ``foreach``/``do`` does::

      train:
        foreach:                 # key -> values of ${item.NAME}
          show_tell: {features: grid}
          top_down: {features: regions}
        do:
          cmd: capstack train configs/experiments/${key}.yaml --out runs/${key}
          deps:
            - data/features/${item.features}.json
          outs:
            - runs/${key}

gives the stages ``train@show_tell`` and ``train@top_down``; the ``${key}`` and
``${item.NAME}`` a stage uses are recorded among its params.

A list the file uses in several places is named once under ``vars``, as DVC's
``vars`` are, and referenced: ``foreach: ${approaches}`` loops over its keys
(and values); in a ``foreach`` list, a ``cmd`` word, a dep or an out, a word
holding ``${approaches}`` stands for one word per key, what surrounds the
reference added to each (``evals/${approaches}-rl``)::

    vars:
      approaches:                # key -> values of ${item.NAME}
        show_tell: {features: grid}
        top_down: {features: regions}
    stages:
      train:
        foreach: ${approaches}
        do: {cmd: capstack train configs/experiments/${key}.yaml --out runs/${key}, ...}
      evaluate:
        foreach:                 # block lists: YAML reads { in a [flow list] as a mapping
          - ${approaches}
          - ${approaches}-rl
        do: {cmd: capstack evaluate runs/${key} --out evals/${key}, ...}
      tables:
        cmd: capstack report evals/${approaches} evals/${approaches}-rl --out reports
        deps:
          - evals/${approaches}
          - evals/${approaches}-rl

A var is not a param: what a stage records is what its command becomes.

A stage with ``when: NAME`` exists only while the param ``NAME`` is set (not
empty, not false, not 0); ``when: not NAME`` only while it is not. Two stages
may so write the same out, one at a time: an import stage taking over from an
extraction once the user names the files to import::

      extract_regions: {when: not region_source, cmd: ..., outs: [features/regions.json]}
      import_regions: {when: region_source, cmd: ..., outs: [features/regions.json]}

A stage that is off is listed as such by ``capstack stages`` and runs nowhere.

A top-level ``demo: [report]`` names what ``capstack demo`` builds: those stages
and every stage they need (without it, every stage). A dep that is
(or lies inside, or contains) another stage's out makes that stage upstream.
Every problem is reported as ``FILE: FIELD: problem`` before anything runs.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from pipeline.core.errors import CapstackError, not_utf8, shown, too_deep
from pipeline.core.regular import read_text
from pipeline.core.yamlfile import check_expanded

_PARAM_REF = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# @key: a foreach key, which may be a relative path (train@stack_cap/top_down) and name a
# variant with + (train@stack_cap/variants/top_down+feature_embed)
_STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*)?$")
_LOOP_KEYS = {"foreach", "do"}
_TOP_KEYS = {"params", "vars", "stages", "demo"}
_STAGE_KEYS = {"desc", "cmd", "deps", "outs", "params", "nproc", "when", "shell"}
SHELL = "/bin/sh"  # what runs the cmd of a stage with ``shell: true``, as ``/bin/sh -c CMD``
_WHEN = re.compile(r"^(not\s+)?(?!not$)([A-Za-z_][A-Za-z0-9_.]*)$")
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Stage:
    """One stage with every ``${param}`` resolved."""

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


@dataclass
class StagesFile:
    path: Path
    params: dict[str, Any]
    templates: dict[str, StageTemplate]  # in file order
    commands: frozenset[str]
    stages: dict[str, Stage] = field(default_factory=dict)
    parallel: frozenset[str] | None = None  # commands that take --nproc (None: not checked)
    demo: tuple[str, ...] = ()  # what `capstack demo` builds (with what it needs); () = all
    upstream: dict[str, tuple[str, ...]] = field(default_factory=dict)
    order: tuple[str, ...] = ()
    off: dict[str, str] = field(default_factory=dict)  # stages whose ``when`` does not hold: why

    def stage(self, name: str) -> Stage:
        if name in self.off:
            raise CapstackError(f"{self.path}: stage '{name}' is off ({self.off[name]})")
        if name not in self.stages:
            raise CapstackError(
                f"{self.path}: no stage named '{name}' (stages: {', '.join(self.stages)})"
            )
        return self.stages[name]

    def with_overrides(self, name: str, assignments: Iterable[str]) -> Stage:
        """The stage ``name`` with ``--set NAME=VALUE`` overrides applied."""
        stage = self.stage(name)
        assignments = list(assignments)
        if not assignments:
            return stage
        return self.overridden(name, dict(parse_assignment(text, stage, self.path)
                                          for text in assignments))

    def overridden(self, name: str, overrides: Mapping[str, Any]) -> Stage:
        """The stage ``name`` with its params ``overrides`` (typed values) applied."""
        self.stage(name)
        template = self.templates[name]
        if "key" in overrides and "key" in template.loop:
            raise CapstackError(f"--set key=...: stage '{name}' in {self.path} is the foreach "
                                f"entry '{template.loop['key']}'; run another entry instead")
        # a foreach entry's ${item.NAME} is overridden in the entry, a stage's own param in the
        # stage, any other in the file's shared params
        loop = {**template.loop, **{k: v for k, v in overrides.items() if k in template.loop}}
        own = {**template.params, **{k: v for k, v in overrides.items() if k in template.params}}
        shared = {**self.params, **{k: v for k, v in overrides.items()
                                    if k not in template.params and k not in template.loop}}
        return _resolve(self.path, replace(template, loop=loop), shared, own, self.commands,
                        self.parallel)

    def with_stages(self, changed: Mapping[str, Stage]) -> "StagesFile":
        """This file with some stages replaced (each already resolved, e.g. ``overridden``),
        its graph checked and ordered again."""
        stages = {name: changed.get(name, stage) for name, stage in self.stages.items()}
        _check_outs_disjoint(self.path, stages)
        upstream = _upstream_of(stages)
        return replace(self, stages=stages, upstream=upstream,
                       order=_topological_order(self.path, stages, upstream))

    def downstream_closure(self, names: Iterable[str]) -> list[str]:
        """``names`` and every stage that depends on one of them, directly or not, in run
        order."""
        reached = set(names)
        for name in self.order:
            if any(u in reached for u in self.upstream[name]):
                reached.add(name)
        return [name for name in self.order if name in reached]

    def upstream_closure(self, name: str) -> list[str]:
        """Stages ``name`` depends on, directly or not, in run order."""
        needed: set[str] = set()
        todo = list(self.upstream[name])
        while todo:
            u = todo.pop()
            if u not in needed:
                needed.add(u)
                todo.extend(self.upstream[u])
        return [s for s in self.order if s in needed]


# -- loading ---------------------------------------------------------------------------
def load_stages_file(path: str | os.PathLike, commands: Iterable[str],
                     parallel: Iterable[str] | None = None) -> StagesFile:
    """Read, validate and resolve a stages file.

    ``commands`` are the capstack sub-commands a stage may run; ``parallel``
    those that can run as several processes (a stage's ``nproc``).
    """
    path = Path(path)
    raw = _read_yaml(path)
    commands = frozenset(commands)
    parallel = None if parallel is None else frozenset(parallel)
    shared = _check_params(path, "params", raw.get("params", {}) or {})
    lists = _check_vars(path, raw.get("vars", {}) or {}, shared)
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, dict) or not stages_raw:
        raise CapstackError(f"{path}: stages: expected a mapping of stage names to stages")
    templates: dict[str, StageTemplate] = {}
    size = _Size(path)
    for name, body in stages_raw.items():
        body = _with_vars(path, f"stages.{name}", body, lists)
        size.add(name, body)
        for template in _expand(path, name, body):
            if template.name in templates:
                raise CapstackError(f"{path}: stages.{template.name}: declared twice")
            templates[template.name] = template
    resolved = {
        name: _resolve(path, t, shared, t.params, commands, parallel)
        for name, t in templates.items()
    }
    off = {name: why for name, t in templates.items()
           if (why := _off_because(path, t, {**shared, **t.params, **t.loop}))}
    resolved = {name: stage for name, stage in resolved.items() if name not in off}
    sf = StagesFile(path=path, params=shared, templates=templates, commands=commands,
                    stages=resolved, parallel=parallel, off=off)
    sf.demo = _check_demo(path, raw.get("demo"), resolved)
    _check_outs_disjoint(path, resolved)
    sf.upstream = _upstream_of(resolved)
    sf.order = _topological_order(path, resolved, sf.upstream)
    return sf


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML keeps the last silently,
    so a second stage of the same name would replace the first)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict:
    try:
        text = read_text(path, "a stages file")
    except FileNotFoundError:
        raise CapstackError(f"{path}: stages file not found") from None
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from None
    except OSError as e:
        raise CapstackError(f"{path}: cannot read stages file ({e.strerror})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise CapstackError(f"{path}: not valid YAML{at}: {problem}") from None
    except RecursionError:
        raise too_deep(path) from None
    if not isinstance(data, dict):
        raise CapstackError(f"{path}: expected a mapping with a 'stages' key")
    check_expanded(data, str(path), "a stages file")
    _refuse_unknown_keys(path, "", data, _TOP_KEYS)
    return data


def _refuse_unknown_keys(path: Path, where: str, body: dict, allowed: set[str],
                         beside: str = "") -> None:
    """``FILE: WHERE.KEY: unknown key (allowed: ...)`` for the first key not in ``allowed``."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        field = f"{where}.{unknown[0]}" if where else unknown[0]
        raise CapstackError(f"{path}: {field}: unknown key{beside} "
                            f"(allowed: {', '.join(sorted(allowed))})")


def _check_demo(path: Path, demo: Any, stages: Mapping[str, Stage]) -> tuple[str, ...]:
    """The top-level ``demo:`` list (or one name): stages that exist."""
    if demo is None:
        return ()
    names = [demo] if isinstance(demo, str) else demo
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise CapstackError(f"{path}: demo: expected a stage name or a list of them")
    for name in names:
        if name not in stages:
            raise CapstackError(f"{path}: demo: no stage named '{name}'")
    return tuple(names)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_params(path: Path, where: str, params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise CapstackError(f"{path}: {where}: expected a mapping of names to values")
    for key, value in params.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise CapstackError(f"{path}: {where}: invalid param name {key!r}")
        if value is None or not isinstance(value, _SCALARS):
            raise CapstackError(
                f"{path}: {where}.{key}: expected a string, number or boolean, "
                f"got {_type_name(value)}"
            )
    return dict(params)


def _check_str_list(path: Path, where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CapstackError(f"{path}: {where}: expected a list of paths")
    return tuple(value)


_VAR_REF = re.compile(r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}")


def _check_vars(path: Path, raw: Any, shared: Mapping[str, Any]) -> dict[str, dict]:
    """``vars``: name -> a list of keys, or a mapping of keys to values (as a foreach takes)."""
    if not isinstance(raw, dict):
        raise CapstackError(f"{path}: vars: expected a mapping of names to lists")
    out = {}
    for name, value in raw.items():
        where = f"vars.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise CapstackError(f"{path}: vars: invalid name {name!r}")
        if name in shared:
            raise CapstackError(f"{path}: {where}: also a param; a name is one or the other")
        if isinstance(value, list):
            value = {item: {} for item in value}
        if not isinstance(value, dict) or not value or not all(
                isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
            raise CapstackError(f"{path}: {where}: expected a non-empty list of keys or a "
                                f"mapping of keys to values")
        out[name] = {str(k): _check_params(path, f"{where}.{k}", v or {})
                     for k, v in value.items()}
    return out


# Bounds on what vars and foreach make of a stages file (the demo's: 59 stages, 825 words; the
# COCO replication's: 95 stages, 1,291 words): past them a file of a few hundred bytes would
# make one command of millions of words, or tens of thousands of stages.
MAX_STAGES = 2_000
MAX_WORDS = 100_000  # words of the cmds, deps and outs of every stage together


class _Size:
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


def _with_vars(path: Path, where: str, body: Any, lists: Mapping[str, dict]) -> Any:
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


def _expand(path: Path, name: Any, body: Any) -> list[StageTemplate]:
    """One stage, or the ``name@key`` stages of a ``foreach``/``do`` entry."""
    if not isinstance(body, dict) or "foreach" not in body:
        return [_check_stage(path, name, body)]
    where = f"stages.{name}"
    if not isinstance(name, str) or not _STAGE_NAME.match(name):
        raise CapstackError(f"{path}: {where}: invalid stage name")
    _refuse_unknown_keys(path, where, body, _LOOP_KEYS, beside=" next to foreach")
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
        values = _check_params(path, f"{where}.foreach.{key}", values or {})
        template = _check_stage(path, f"{name}@{key}", body.get("do"))
        loop = {"key": str(key), **{f"item.{k}": v for k, v in values.items()}}
        # an entry's own params may name its key and items: config: configs/${key}.yaml
        params = {k: _substitute(path, f"{where}.do.params.{k}", v, loop, {}, False)
                  if isinstance(v, str) else v for k, v in template.params.items()}
        templates.append(StageTemplate(**{**template.__dict__, "loop": loop, "params": params}))
    return templates


def _check_stage(path: Path, name: Any, body: Any) -> StageTemplate:
    where = f"stages.{name}"
    if not isinstance(name, str) or not _STAGE_NAME.match(name):
        raise CapstackError(f"{path}: {where}: invalid stage name")
    if not isinstance(body, dict):
        raise CapstackError(f"{path}: {where}: expected a mapping with a 'cmd'")
    _refuse_unknown_keys(path, where, body, _STAGE_KEYS)
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
    if not isinstance(when, str) or (when and not _WHEN.match(when.strip())):
        raise CapstackError(f"{path}: {where}.when: expected NAME or 'not NAME' of a param, "
                            f"got {when!r}")
    return StageTemplate(
        name=name,
        desc=desc,
        cmd=cmd,
        deps=_check_str_list(path, f"{where}.deps", body.get("deps")),
        outs=_check_str_list(path, f"{where}.outs", body.get("outs")),
        params=_check_params(path, f"{where}.params", body.get("params") or {}),
        nproc=nproc,
        when=when.strip(),
        shell=shell,
    )


def _off_because(path: Path, t: StageTemplate, lookup: Mapping[str, Any]) -> str:
    """Why the stage is off ("" when it is on): its ``when`` does not hold."""
    if not t.when:
        return ""
    match = _WHEN.match(t.when)
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


# -- resolving ${params} -----------------------------------------------------------------
def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _substitute(path: Path, where: str, text: str, lookup: Mapping[str, Any], used: dict,
                quote: bool) -> str:
    def replace(match: re.Match) -> str:
        key = match.group(1).strip()
        if key not in lookup:
            known = ", ".join(sorted(lookup)) or "none"
            raise CapstackError(f"{path}: {where}: unknown param ${{{key}}} (params: {known})")
        used[key] = lookup[key]
        rendered = _render(lookup[key])
        return shlex.quote(rendered) if quote else rendered

    return _PARAM_REF.sub(replace, text)


def _normalise(p: str) -> str:
    return os.path.normpath(os.path.expanduser(p))


def _resolve(path: Path, t: StageTemplate, shared: Mapping[str, Any], own: Mapping[str, Any],
             commands: frozenset, parallel: frozenset | None = None) -> Stage:
    where = f"stages.{t.name}"
    lookup = {**shared, **own, **t.loop}
    used: dict[str, Any] = {}
    # without a shell each param's value is one word; in a shell's cmd it is pasted as it is
    cmd = _substitute(path, f"{where}.cmd", t.cmd, lookup, used, quote=not t.shell)
    deps = tuple(_normalise(_substitute(path, f"{where}.deps", d, lookup, used, False))
                 for d in t.deps)
    outs = tuple(_normalise(_substitute(path, f"{where}.outs", o, lookup, used, False))
                 for o in t.outs)
    unused = sorted(set(own) - set(used))
    if unused:
        raise CapstackError(
            f"{path}: {where}.params.{unused[0]}: declared but not used in cmd, deps or outs"
        )
    params = dict(sorted(used.items()))
    command, argv = _command_of(path, where, t, cmd, commands, parallel)
    return Stage(t.name, t.desc, cmd, t.cmd, argv, command, deps, outs, params, t.nproc,
                 t.shell)


def _command_of(path: Path, where: str, t: StageTemplate, cmd: str, commands: frozenset,
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


# -- the graph ---------------------------------------------------------------------------
def _parts(p: str) -> tuple[str, ...]:
    """A normalised path's names: ``p`` lies inside ``q`` (or is it) when ``q``'s names start
    ``p``'s; sorted by them, what lies inside a path follows it at once."""
    return tuple(p.rstrip(os.sep).split(os.sep))


def _check_outs_disjoint(path: Path, stages: Mapping[str, Stage]) -> None:
    """Refuse two outs of which one is or holds the other. Sorted by their names, an out
    holding others is followed by them at once, so neighbours are all that is compared:
    n log n for n outs, where every pair took seconds for thousands of stages."""
    owners = sorted((_parts(o), k, o, s.name)
                    for k, (s, o) in enumerate((s, o) for s in stages.values() for o in s.outs))
    for first, second in zip(owners, owners[1:]):
        if second[0][:len(first[0])] == first[0]:
            (_, _, out_a, stage_a), (_, _, out_b, stage_b) = sorted((first, second),
                                                                    key=lambda o: o[1])
            raise CapstackError(
                f"{path}: stages.{stage_b}.outs: '{out_b}' overlaps '{out_a}', "
                f"an out of stage '{stage_a}'"
            )


def _upstream_of(stages: Mapping[str, Stage]) -> dict[str, tuple[str, ...]]:
    """For each stage, the stages whose outs it depends on: an out that is the dep, holds it,
    or lies inside it. Found through the outs by name (those holding a dep, one lookup per
    folder above it) and sorted (those inside it, a range), not stage by stage."""
    owner = {_parts(o): s.name for s in stages.values() for o in s.outs}
    by_name = sorted(owner)
    position = {name: k for k, name in enumerate(stages)}
    upstream = {}
    for stage in stages.values():
        producers: list[str] = []
        for dep in stage.deps:
            parts = _parts(dep)
            found = {owner[parts[:n]] for n in range(1, len(parts) + 1) if parts[:n] in owner}
            k = bisect.bisect_left(by_name, parts)
            while k < len(by_name) and by_name[k][:len(parts)] == parts:
                found.add(owner[by_name[k]])
                k += 1
            producers += [n for n in sorted(found, key=position.__getitem__)
                          if n not in producers]
        upstream[stage.name] = tuple(producers)
    return upstream


def _topological_order(path: Path, stages: Mapping[str, Stage],
                       upstream: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = trail[trail.index(name):] + [name]
            raise CapstackError(f"{path}: stages: dependency cycle: {' -> '.join(cycle)}")
        state[name] = "visiting"
        for up in upstream[name]:
            visit(up, trail + [name])
        state[name] = "done"
        order.append(name)

    for name in stages:
        visit(name, [])
    return tuple(order)


# -- --set NAME=VALUE --------------------------------------------------------------------
def parse_assignment(text: str, stage: Stage, path: Path) -> tuple[str, Any]:
    """Parse ``NAME=VALUE`` for ``stage``; the value must keep the param's type."""
    key, value_text = _assigned(text, stage, path)
    return key, coerce_like(stage.params[key], value_text, f"--set {text}")


def _assigned(text: str, stage: Stage, path: Path) -> tuple[str, str]:
    """``NAME=VALUE`` as the name of a param of ``stage`` and the value's text."""
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise CapstackError(f"--set {text}: expected NAME=VALUE")
    if key not in stage.params:
        known = ", ".join(stage.params) or "none"
        raise CapstackError(
            f"--set {text}: stage '{stage.name}' in {path} has no param '{key}' (params: {known})"
        )
    return key, value_text


MAX_VALUES = 100  # values one --set may list for a grid


def parse_values(text: str, stage: Stage, path: Path) -> tuple[str, list[Any]]:
    """Parse ``NAME=VALUE`` or ``NAME=V1,V2,...`` (a grid's axis) for ``stage``: the values,
    each typed like the param, once each, in the given order.

    A number's or a boolean's value never holds a comma (``1,2`` was refused as no number),
    so ``lr=1e-4,5e-4`` (or ``lr=[1e-4, 5e-4]``) lists values. A string's may: ``a,b.yaml`` is
    one path as well as two, and is refused as ambiguous; ``'[a.yaml, b.yaml]'`` (a YAML
    list) lists values, ``'"a,b.yaml"'`` (a YAML quoted string) is the one value. A string
    without a comma is the value as typed, as :func:`parse_assignment` reads it."""
    key, value_text = _assigned(text, stage, path)
    current, where = stage.params[key], f"--set {text}"
    if isinstance(current, str):
        values = [value_text] if "," not in value_text else _string_values(text, key, value_text)
    else:
        items = _listed(value_text, where) if value_text.lstrip().startswith("[") \
            else value_text.split(",")
        values = [coerce_like(current, item, where) for item in items]
    if not values:
        raise CapstackError(f"{where}: names no value")
    if len(values) > MAX_VALUES:
        raise CapstackError(f"{where}: names {len(values)} values, more than the {MAX_VALUES} "
                            f"one --set may list")
    unique: list[Any] = []
    for value in values:
        if not any(type(v) is type(value) and v == value for v in unique):
            unique.append(value)
    return key, unique


def _listed(text: str, where: str) -> list[str]:
    """The items of a YAML flow list, each as its text (typed later, like the param)."""
    try:
        items = yaml.load(text, Loader=yaml.BaseLoader)  # every scalar a string, as typed
    except yaml.YAMLError as e:
        raise CapstackError(f"{where}: not a YAML list ({getattr(e, 'problem', e)})") from None
    except RecursionError:
        raise too_deep(where) from None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise CapstackError(f"{where}: expected a list of values ([a, b]), got {shown(text)}")
    return items


def _string_values(text: str, key: str, value_text: str) -> list[str]:
    """A string param's value holding a comma: the values of a YAML list, or the one value of
    a YAML quoted string; anything else is refused, naming both ways to write it."""
    stripped = value_text.strip()
    if stripped.startswith("["):
        return _listed(stripped, f"--set {text}")
    if len(stripped) > 1 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        try:
            value = yaml.safe_load(stripped)
        except yaml.YAMLError:
            value = None
        if isinstance(value, str):
            return [value]
    parts = ", ".join(p.strip() for p in value_text.split(","))
    raise CapstackError(
        f"--set {text}: '{key}' is a string param, and a string may hold a comma: for a grid of "
        f"values write them as a YAML list (--set '{key}=[{parts}]'); for the one value "
        f"{shown(value_text)}, quote it (--set '{key}=\"{value_text}\"')")


_EXPONENT_FLOAT = re.compile(r"[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+")


def coerce_like(current: Any, text: str, where: str) -> Any:
    """``text`` converted to the type of ``current``, or a CapstackError naming ``where``."""
    if isinstance(current, str):
        return text
    value: Any
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    expected = _type_name(current)
    if isinstance(current, bool):
        ok = isinstance(value, bool)
    elif isinstance(current, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:  # float; 1e-4 too (YAML 1.1 reads a float only with a dot, 1.0e-4)
        if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
            value = float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    if not ok:
        raise CapstackError(f'{where}: expected {expected}, got "{text}"')
    return value
