"""No import runs back up: capstack's modules import each other without a cycle.

Every import counts, a function's own included (a lazy import is still a dependency); the
exceptions are a plug package and its own modules (the package imports them to fill its
registry, each imports the registry), and an import for annotations only (under ``if
TYPE_CHECKING:``, never run). A cycle means a lower part knows a higher one
(a decoder drawing through the evaluation stage, the scoring below the rewards importing them).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from pipeline.engine.codeversion import PROJECT_PACKAGES, imported_modules, project_root

ROOT = project_root()


def modules() -> dict[str, Path]:
    found = {}
    for package in PROJECT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def run_time_tree(path: Path) -> ast.Module:
    """The file's syntax tree less its ``if TYPE_CHECKING:`` blocks (imports never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                setattr(node, field, [n for n in block if not (
                    isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")])
    return tree


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (``from pkg import name`` counted as ``pkg``
    when ``name`` is no module), without a package's edges to and from its own modules."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for target in imported_modules(path, name, path.name == "__init__.py",
                                       run_time_tree(path)):
            while target and target not in known:
                target = target.rpartition(".")[0]
            own = target.startswith(name + ".") or name.startswith(target + ".")
            if target and target != name and not own:
                targets.add(target)
        graph[name] = targets
    return graph


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        raise AssertionError(f"an import cycle: {' -> '.join(cycle.args[1])}") from None
    assert set(order) >= set(graph)


def test_the_scoring_library_imports_nothing_above_it():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("trainer.scoring"):
            above = {t for t in targets if t.startswith("trainer.")
                     and not t.startswith("trainer.scoring")}
            assert above == set(), (name, above)


def test_no_decoder_model_part_or_reward_imports_the_stages_above_it():
    graph = import_graph()
    lower = ("trainer.decoders", "trainer.modules", "trainer.rewards", "trainer.scoring",
             "trainer.decode")
    upper = ("trainer.evaluation", "trainer.train", "trainer.training", "trainer.objectives",
             "trainer.runs")
    for name, targets in graph.items():
        if name.startswith(lower):
            assert {t for t in targets if t.startswith(upper)} == set(), name
