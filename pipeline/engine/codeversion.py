"""The version of the code a stage runs: the source files its command can load.

A stage's command is implemented by one module (``pipeline.captions.prepare`` for
``capstack prepare``). Its code version is the set of project source files that
module reaches, found by reading the source (no code is imported or run, so
checking a stage never pays for importing torch):

- every ``import`` / ``from ... import`` statement, at any depth of the file;
- every module of a plug package: a package whose ``__init__`` calls the one
  discovery helper, ``import_modules(__name__, __path__)``
  (pipeline/core/registry.py), loads every module in its folder at run time, so
  all of them are part of the version of any command that imports the package.
  Plug packages load their modules through that helper and no other way
  (tests/test_registries.py holds every registry to it), which is what keeps
  this rule from drifting from what a process really loads.

Editing any of those files makes the stage stale; editing an unrelated module
does not. What counts is a file's code, not its text: each file's digest
(:func:`code_digest`) is taken over its syntax tree without comments, layout
or docstrings, so an edit to those alone leaves the stage up to date, while any
change to executable code, a default value included, makes it stale.

A code file may also name installed distributions whose version is part of the
code version, as a top-level literal ``CODE_DISTRIBUTIONS = ("simplemma",)``
(pipeline/captions/lemmatizers/simplemma_english.py: a lemmatiser's new dictionaries give other
lemmas). Installing another version of one, or removing it, makes the stage stale;
other libraries' versions are not tracked.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import pkgutil
from functools import lru_cache
from pathlib import Path

from pipeline.core.registry import import_modules

PROJECT_PACKAGES = ("pipeline", "trainer")
DISTRIBUTIONS_NAME = "CODE_DISTRIBUTIONS"
NOT_INSTALLED = "not installed"
DISCOVERY_HELPER = import_modules.__name__
CODE_RULE = "syntax tree without docstrings, registries followed"  # recorded in the lock


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


def _calls_discovery_helper(node: ast.AST) -> bool:
    """Whether ``node`` is a call of :func:`~pipeline.core.registry.import_modules`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return ((isinstance(func, ast.Name) and func.id == DISCOVERY_HELPER)
            or (isinstance(func, ast.Attribute) and func.attr == DISCOVERY_HELPER))


def _package_modules(path: Path, package: str) -> set[str]:
    """Every module in the folder of the package whose ``__init__`` is ``path``."""
    return {f"{package}.{m.name}" for m in pkgutil.iter_modules([str(path.parent)])}


def imported_modules(path: Path, module: str, is_package: bool,
                     tree: ast.AST | None = None) -> set[str]:
    """Every module name an ``import``/``from ... import`` in ``path`` may load, and, when
    ``path`` is a package's ``__init__`` calling the discovery helper, its every module
    (``tree``: the file's syntax tree, when the caller has it)."""
    if tree is None:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if is_package and _calls_discovery_helper(node):
            found.update(_package_modules(path, module))
        elif isinstance(node, ast.Import):
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
        todo.extend(imported_modules(path, name, path.name == "__init__.py"))
    return tuple(sorted(set(seen.values())))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` less the docstring of its module, classes and functions (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:]
    return tree


def code_digest(path: str | Path) -> str:
    """The md5 of a Python file's code: its syntax tree (``ast.dump``: no positions, so no
    comments or layout) without docstrings. A file that does not parse is digested by its
    bytes, so that it still changes the version (and the command will say what is wrong).
    Remembered in the process while the file's inode, mtime and size are unchanged."""
    st = os.stat(path)
    return _code_digest(os.path.abspath(path), st.st_ino, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4096)
def _code_digest(path: str, inode: int, mtime_ns: int, size: int) -> str:
    data = Path(path).read_bytes()
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError):
        return hashlib.md5(b"unparsed\0" + data).hexdigest()
    return hashlib.md5(ast.dump(_without_docstrings(tree)).encode()).hexdigest()


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
