"""The version of the code a stage runs: the source files its command imports.

A stage's command is implemented by one module (``pipeline.captions.prepare`` for
``capstack prepare``). Its code version is the set of project source files that
module reaches through imports, found by reading ``import`` statements (no code
is imported or run, so checking a stage never pays for importing torch).
Editing any of those files makes the stage stale; editing an unrelated module
does not.

A code file may also name installed distributions whose version is part of the
code version, as a top-level literal ``CODE_DISTRIBUTIONS = ("simplemma",)``
(pipeline/captions/lemmatize.py: a lemmatiser's new dictionaries give other
lemmas). Installing another version of one, or removing it, makes the stage stale;
other libraries' versions are not tracked.
"""

from __future__ import annotations

import ast
import importlib.metadata
from functools import lru_cache
from pathlib import Path

PROJECT_PACKAGES = ("pipeline", "trainer")
DISTRIBUTIONS_NAME = "CODE_DISTRIBUTIONS"
NOT_INSTALLED = "not installed"


def project_root() -> Path:
    """The folder holding the ``pipeline`` and ``trainer`` packages."""
    return Path(__file__).resolve().parents[2]


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_inits(root: Path, module: str) -> list[str]:
    """``a.b.c`` -> [``a``, ``a.b``]: importing a module runs its packages' ``__init__``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported_modules(path: Path, module: str, is_package: bool) -> set[str]:
    """Every module name an ``import``/``from ... import`` in ``path`` may load."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(p for p in [*base_parts, node.module or ""] if p)
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


@lru_cache(maxsize=None)
def code_files(module: str, root: Path | None = None) -> tuple[Path, ...]:
    """Project source files ``module`` depends on, itself included, sorted."""
    root = root or project_root()
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] not in PROJECT_PACKAGES:
            continue
        path = _module_file(root, name)
        if path is None:
            continue  # ``from pkg import function``: not a module
        seen[name] = path
        todo.extend(_package_inits(root, name))
        todo.extend(_imported_modules(path, name, path.name == "__init__.py"))
    return tuple(sorted(set(seen.values())))


def _declared_distributions(path: Path) -> set[str]:
    """The names a top-level ``CODE_DISTRIBUTIONS = (...)`` in ``path`` lists (none if absent)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == DISTRIBUTIONS_NAME for t in node.targets):
            names = ast.literal_eval(node.value)
            if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"{path}: {DISTRIBUTIONS_NAME} must be a tuple of names")
            return set(names)
    return set()


@lru_cache(maxsize=None)
def code_distributions(module: str, root: Path | None = None) -> tuple[str, ...]:
    """Installed distributions whose version is part of ``module``'s code version, sorted."""
    return tuple(sorted({name for path in code_files(module, root)
                         for name in _declared_distributions(path)}))


def distribution_versions(names) -> dict[str, str]:
    """``{"installed NAME": version}`` for each name, read now (a version changes between
    runs); ``not installed`` for one that is absent."""
    versions = {}
    for name in names:
        try:
            versions[f"installed {name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[f"installed {name}"] = NOT_INSTALLED
    return versions
