"""The graph of a stages file's stages: which stage is upstream of which (a dep that is, holds
or lies inside another stage's out), the order they run in, and outs that overlap refused."""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Mapping

from pipeline.core.errors import CapstackError
from pipeline.engine.stagedecl import Stage


def _parts(p: str) -> tuple[str, ...]:
    """A normalised path's names: ``p`` lies inside ``q`` (or is it) when ``q``'s names start
    ``p``'s; sorted by them, what lies inside a path follows it at once."""
    return tuple(p.rstrip(os.sep).split(os.sep))


def check_outs_disjoint(path: Path, stages: Mapping[str, Stage]) -> None:
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


def upstream_of(stages: Mapping[str, Stage]) -> dict[str, tuple[str, ...]]:
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


def topological_order(path: Path, stages: Mapping[str, Stage],
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
