"""docs/layout.md's rules, read from the code: the modules import each other without a cycle,
the imports run the ways the Layout section says, and no module grows past MAX_LINES.

The graph is of what importing a module runs: its module-level imports (``import a.b``,
``from a import b`` -- ``a.b`` when that is a module, else ``a`` --, relative ones resolved),
those in a top-level ``if``, ``try`` or class body included; an import inside a function (run
when called) and one under ``if TYPE_CHECKING:`` (never run) are left out. Its modules:
cli.py, pipeline/, trainer/ and benchmarks/common.py. tests/test_layers.py checks the graph of
every import, a function's own included.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "trainer")
SINGLE = {"cli": ROOT / "cli.py", "benchmarks.common": ROOT / "benchmarks" / "common.py"}
MAX_LINES = 600
SIZED = ("cli.py", "pipeline", "trainer", "benchmarks", "tests")  # what MAX_LINES holds for

# (importer, what it may import of the project besides itself): docs/layout.md's arrows
MAY_IMPORT = [
    ("pipeline.core", ()),  # the foundation, which imports none of the areas
    ("pipeline.engine", ("pipeline.core",)),  # the stage engine: no trainer, no features
    ("pipeline.captions", ("pipeline.core",)),
    ("pipeline.vision", ("pipeline.core",)),
    ("pipeline.features.stores", ("pipeline.core",)),  # a store knows no extractor
    ("pipeline.features", ("pipeline.features", "pipeline.vision", "pipeline.captions",
                           "pipeline.core")),
    ("pipeline.demo", ("pipeline.vision", "pipeline.captions", "pipeline.core")),
    ("pipeline", ("pipeline",)),  # never trainer/, cli.py or the benchmarks
    ("trainer", ("trainer", "pipeline.core", "pipeline.captions", "pipeline.features.stores")),
]
# what every module may import besides: the root package (capstack's __version__)
ANYONE_MAY_IMPORT = ("pipeline",)
# a command module (pipeline/*/commands.py, trainer/commands/: the cli's, beside the code it
# drives) may import what every command shares besides
COMMAND_LINE = "pipeline.commandline"
# (importer, what it never imports): extraction -> detectors (never back), a decoder knows no
# loop or dataset, decoding no run
NEVER_IMPORTS = [
    ("pipeline.features.detectors", ("pipeline.features.extract",)),
    ("trainer.decoders", ("trainer.training", "trainer.train", "trainer.data", "trainer.batch",
                          "trainer.evaluation", "trainer.checkpoint", "pipeline.captions")),
    ("trainer.decoding", ("trainer.training", "trainer.train", "trainer.data",
                          "trainer.evaluation", "trainer.checkpoint", "trainer.config")),
]


def modules() -> dict[str, Path]:
    """module name -> its file, for every module of the graph."""
    found = dict(SINGLE)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def run_on_import(body: list[ast.stmt]):
    """The statements importing a module runs: not a function's, not ``if TYPE_CHECKING:``."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from run_on_import(node.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield from run_on_import(block)


def module_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules importing ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in run_on_import(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {target for target in found if target in known and target != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: module_imports(name, path, known) for name, path in known.items()}


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_modules_import_each_other_without_a_cycle():
    try:
        tuple(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as cycle:
        raise AssertionError(f"an import cycle: {' -> '.join(cycle.args[1])}") from None


def test_the_imports_run_the_ways_the_layout_says():
    wrong = []
    for name, targets in sorted(import_graph().items()):
        rule = next(((prefix, allowed) for prefix, allowed in MAY_IMPORT
                     if within(name, prefix)), None)
        if rule is not None:
            prefix, allowed = rule
            allowed = (*allowed, *((COMMAND_LINE,) if "commands" in name.split(".") else ()))
            wrong += [f"{name} imports {target} ({prefix} imports only "
                      f"{', '.join(allowed)})" for target in sorted(targets)
                      if target not in ANYONE_MAY_IMPORT
                      and not any(within(target, a) for a in (prefix, *allowed))]
        for prefix, never in NEVER_IMPORTS:
            if within(name, prefix):
                wrong += [f"{name} imports {target} ({prefix} never imports it)"
                          for target in sorted(targets) if any(within(target, n) for n in never)]
    assert wrong == [], "\n".join(wrong)


def test_a_rule_names_modules_that_exist():
    """Each rule's modules are there (a package renamed leaves no rule checking nothing)."""
    known = modules()
    named = {p for p, allowed in MAY_IMPORT for p in (p, *allowed)}
    named |= {p for p, never in NEVER_IMPORTS for p in (p, *never)}
    assert {p for p in named if not any(within(m, p) for m in known)} == set()


@pytest.mark.parametrize("place", SIZED)
def test_no_module_is_longer_than_the_limit(place):
    files = [ROOT / place] if place.endswith(".py") else sorted((ROOT / place).rglob("*.py"))
    long = [f"{path.relative_to(ROOT)}: {lines} lines" for path in files
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert long == [], f"over {MAX_LINES} lines (split by idea):\n" + "\n".join(long)


def test_the_command_table_loads_without_torch():
    """Every `capstack` call (`--help`, `stages`, each stage the engine starts) imports cli.py and
    its command modules first: a command imports torch inside, where it needs it, or each call
    pays the seconds torch takes to import."""
    code = "import sys, cli; print([m for m in ('torch', 'h5py', 'lmdb') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert out.strip() == "[]"
