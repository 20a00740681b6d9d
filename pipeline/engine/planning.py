"""What ``capstack run STAGE`` asks for, as experiments: ``--set`` (one value, or a grid of
values) and ``--seeds`` planned into the runs of a command, checked before anything is written
(manifests.py writes each when its stage runs). Which param a seed is, the stages file says
(its ``seed_param:``): the engine knows no param by name.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, Iterable

from pipeline.core.errors import CapstackError, shown
from pipeline.engine.manifests import (MANIFEST, Experiment, auto_name, experiments, folder_of,
                                       open_experiment, read_experiment)
from pipeline.engine.stagefile import Stage, StagesFile, parse_values
from pipeline.engine.stages import Pipeline, same_value

MAX_SEEDS = 100  # seeds one --seeds may name: each is a run, most an experiment of its own
MAX_SEED = 2**32 - 1  # the largest seed (train.seed's bound)
MAX_RUNS = 1000  # runs one command may plan: a grid's points times its seeds


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
    seed = file.seed_name()  # the param a seed is, as the stages file names it
    if seed not in stage.params:
        if asked:
            raise CapstackError(f"--seeds with --set: stage '{stage_name}' has no param "
                                f"'{seed}'; set the params and seeds on a stage that has one")
        return _seed_runs(file, workdir, group, seeds, stage_name)
    if seed in asked:
        raise CapstackError(f"--seeds with a seed set (--set {seed}=...): give the seeds only")
    own_seed = params.get(seed, stage.params[seed])  # the group's seed: the group itself
    base = open_experiment(workdir, group, params, roots) if group else None
    return [base if s == own_seed else
            open_experiment(workdir, f"{group}-seed{s}" if group else f"seed{s}",
                            {**params, seed: s}, roots, group=group, base=base)
            for s in seeds]


def _seed_runs(file: StagesFile, workdir: Path, group: str, seeds: list[int],
               stage_name: str) -> list[Experiment | None]:
    """Where a stage without a seed param runs at each of ``seeds``: the seed's experiment,
    made on a stage upstream that has one (``capstack run train@X --seeds ...``), or the group
    itself (``None``: the baseline) at the seed the group has there."""
    runs: list[Experiment | None] = []
    others: list[Experiment] | None = None  # the experiments, read once when needed
    param = file.seed_name()
    for seed in seeds:
        name = f"{group}-seed{seed}" if group else f"seed{seed}"
        if (folder_of(workdir, name) / MANIFEST).is_file():
            runs.append(read_experiment(workdir, name))
            continue
        group_params = read_experiment(workdir, group).params if group else {}
        others = experiments(workdir) if others is None else others
        seeded = [r for e in others if e.group == group and e.name != group
                  for r in e.roots if r in file.stages and param in file.stages[r].params]
        if not seeded:  # no other seed run yet: the seed of the stages upstream that have one
            seeded = [u for u in file.upstream_closure(stage_name)
                      if param in file.stages[u].params]
        own = {group_params.get(param, file.stages[r].params[param]) for r in seeded}
        if own != {seed}:
            raise CapstackError(
                f"--seeds: no experiment {name} for stage '{stage_name}', which has no param "
                f"'{param}': run the seeds on a stage upstream that has one first (`capstack "
                f"run STAGE --seeds ...`), then this stage over them")
        runs.append(read_experiment(workdir, group) if group else None)
    return runs

