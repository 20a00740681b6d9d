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

A cmd may use ``${experiment}``, which the engine gives when it runs the stage: the
experiment it runs in (its group, what the report calls its rows), empty for the
baseline's. It is no param: never recorded, never ``--set``, so where a stage runs never
makes it stale, and a stage an experiment does not change stays the baseline's::

      evaluate:
        cmd: capstack evaluate runs/m --out evals/m --experiment ${experiment}
        metrics:                 # what `capstack exp show` and `exp diff` read
          - {path: evals/m/metrics.json, show: [metrics.CIDEr], percent: true}

``metrics:`` lists files of numbers the stage writes, each inside one of its outs: a path
(every number at its top level shown) or ``{path, show, percent}``. A top-level
``seed_param: seed`` names the param that ``capstack run --seeds`` sets.
Every problem is reported as ``FILE: FIELD: problem`` before anything runs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from pipeline.core.errors import CapstackError, not_utf8, too_deep
from pipeline.core.regular import read_text
from pipeline.core.yamlfile import check_expanded
from pipeline.engine.assignments import (MAX_VALUES, coerce_like, parse_assignment,
                                         parse_values)
from pipeline.engine.interpolation import (MAX_STAGES, MAX_WORDS, Size, check_vars, expand,
                                           resolve, with_vars)
from pipeline.engine.stagedecl import (BUILTINS, SHELL, MetricsFile, Stage, StageTemplate,
                                       check_params, off_because, refuse_unknown_keys)
from pipeline.engine.stagegraph import check_outs_disjoint, topological_order, upstream_of

__all__ = ["BUILTINS", "MAX_STAGES", "MAX_VALUES", "MAX_WORDS", "SHELL", "MetricsFile", "Stage",
           "StageTemplate", "StagesFile", "coerce_like", "load_stages_file", "parse_assignment",
           "parse_values"]

_TOP_KEYS = {"params", "vars", "stages", "demo", "seed_param"}
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")  # a seed_param: a param, or an item.NAME


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
    seed_param: str = ""  # the param ``capstack run --seeds`` sets (the top-level seed_param:)

    def seed_name(self) -> str:
        """The param ``--seeds`` sets, as the file's top-level ``seed_param:`` names it;
        refused, naming the file and the key to add, where it names none."""
        if not self.seed_param:
            raise CapstackError(f"--seeds: {self.path} names no seed param; add a top-level "
                                f"`seed_param: NAME` naming the param that a stage's seed is "
                                f"(e.g. seed_param: seed)")
        return self.seed_param

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
        return resolve(self.path, replace(template, loop=loop), shared, own, self.commands,
                       self.parallel)

    def with_stages(self, changed: Mapping[str, Stage]) -> "StagesFile":
        """This file with some stages replaced (each already resolved, e.g. ``overridden``),
        its graph checked and ordered again."""
        stages = {name: changed.get(name, stage) for name, stage in self.stages.items()}
        check_outs_disjoint(self.path, stages)
        upstream = upstream_of(stages)
        return replace(self, stages=stages, upstream=upstream,
                       order=topological_order(self.path, stages, upstream))

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
    shared = check_params(path, "params", raw.get("params", {}) or {})
    lists = check_vars(path, raw.get("vars", {}) or {}, shared)
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, dict) or not stages_raw:
        raise CapstackError(f"{path}: stages: expected a mapping of stage names to stages")
    templates: dict[str, StageTemplate] = {}
    size = Size(path)
    for name, body in stages_raw.items():
        body = with_vars(path, f"stages.{name}", body, lists)
        size.add(name, body)
        for template in expand(path, name, body):
            if template.name in templates:
                raise CapstackError(f"{path}: stages.{template.name}: declared twice")
            templates[template.name] = template
    resolved = {
        name: resolve(path, t, shared, t.params, commands, parallel)
        for name, t in templates.items()
    }
    off = {name: why for name, t in templates.items()
           if (why := off_because(path, t, {**shared, **t.params, **t.loop}))}
    resolved = {name: stage for name, stage in resolved.items() if name not in off}
    sf = StagesFile(path=path, params=shared, templates=templates, commands=commands,
                    stages=resolved, parallel=parallel, off=off)
    sf.demo = _check_demo(path, raw.get("demo"), resolved)
    sf.seed_param = _check_seed_param(path, raw.get("seed_param"), templates, resolved)
    check_outs_disjoint(path, resolved)
    sf.upstream = upstream_of(resolved)
    sf.order = topological_order(path, resolved, sf.upstream)
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
    refuse_unknown_keys(path, "", data, _TOP_KEYS)
    return data


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



def _check_seed_param(path: Path, name: Any, templates: Mapping[str, StageTemplate],
                      stages: Mapping[str, Stage]) -> str:
    """The top-level ``seed_param:``: the name of a param some stage has ("" when not given)."""
    if name is None:
        return ""
    if not isinstance(name, str) or not _PARAM_NAME.fullmatch(name):
        raise CapstackError(f"{path}: seed_param: expected the name of the param that a "
                            f"stage's seed is (seed_param: seed), got {name!r}")
    if not any(name in s.params for s in stages.values()) and \
            not any(name in {**t.params, **t.loop} for t in templates.values()):
        raise CapstackError(f"{path}: seed_param: no stage has a param '{name}'")
    return name
