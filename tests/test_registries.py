"""One discovery rule: every registry is a plug package's, filled by ``import_modules``.

The stage engine's code version (pipeline/engine/codeversion.py) counts every module of a
package whose ``__init__`` calls the discovery helper; these tests hold the code to that rule,
so the version cannot drift from what a process really loads.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.registry import Registry
from pipeline.engine.codeversion import PROJECT_PACKAGES, code_files, project_root

ROOT = project_root()
SOURCES = sorted(p for package in PROJECT_PACKAGES for p in (ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def registries_defined(path: Path) -> list[str]:
    """Names bound to ``Registry(...)`` at the top level of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [t.id for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "Registry"
            for t in node.targets if isinstance(t, ast.Name)]


def calls_import_modules(path: Path) -> bool:
    """Whether ``path`` calls ``import_modules(__name__, __path__)`` at its top level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", "") == "import_modules"
               and [getattr(a, "id", "") for a in node.value.args] == ["__name__", "__path__"]
               for node in tree.body)


PLUG_PACKAGES = {module_name(p): names for p in SOURCES if (names := registries_defined(p))}


def test_the_plug_packages_are_the_ones_the_toolkit_names():
    assert PLUG_PACKAGES == {
        "pipeline.captions.lemmatizers": ["LEMMATIZERS"],
        "pipeline.captions.vocab_rules": ["VOCAB_RULES"],
        "pipeline.engine.launchers": ["LAUNCHERS"],
        "pipeline.features.detectors.rules": ["RULES"],
        "pipeline.features.extract.kinds": ["EXTRACTORS"],
        "pipeline.features.interchange.formats": ["FORMATS", "WRITERS"],
        "trainer.decoders": ["DECODERS"],
        "trainer.imports": ["CHECKPOINT_FORMATS"],
        "trainer.objectives": ["OBJECTIVES"],
        "trainer.optimizers": ["OPTIMIZERS"],
        "trainer.rewards": ["REWARDS"],
        "trainer.scoring.metrics": ["METRICS"],
    }


@pytest.mark.parametrize("package", sorted(PLUG_PACKAGES))
def test_every_registry_is_a_package_filled_by_the_one_helper(package):
    init = ROOT.joinpath(*package.split(".")) / "__init__.py"
    assert init.is_file(), f"{package}: a registry lives in a package's __init__.py"
    assert calls_import_modules(init), f"{init}: fill the registry with import_modules"
    module = importlib.import_module(package)
    for name in PLUG_PACKAGES[package]:
        registry = getattr(module, name)
        assert isinstance(registry, Registry) and list(registry)
        for item_name, item in registry.items():
            home = getattr(item, "__module__", None) or type(item).__module__
            if home.split(".")[0] not in PROJECT_PACKAGES:
                continue  # a toy another test module registered in this process
            assert home.startswith(package + "."), \
                f"{package}.{name}[{item_name!r}] is defined in {home}, outside its package"


def test_nothing_else_imports_by_name():
    """A module loaded by a name made at run time would be invisible to the code version."""
    allowed = {ROOT / "pipeline/core/registry.py"}
    dynamic = ("importlib.import_module", "__import__(", "pkgutil.iter_modules",
               "import_module(")
    found = [f"{p.relative_to(ROOT)}: {word}" for p in SOURCES if p not in allowed
             for word in dynamic if word in p.read_text(encoding="utf-8")
             and not (p.name == "codeversion.py" and word == "pkgutil.iter_modules")]
    assert found == []


def stage_modules() -> list[str]:
    import cli

    return sorted(set(cli.stage_commands().values()))


@pytest.mark.parametrize("module", stage_modules())
def test_a_command_loads_no_project_module_outside_its_code_version(module):
    """Import the command's module and every module its version names, in a fresh process:
    whatever they load of capstack at import time is in the version."""
    version = [str(p) for p in code_files(module)]
    names = [module_name(Path(p)) for p in version]
    script = ("import importlib, json, sys\n"
              f"for name in {names!r}: importlib.import_module(name)\n"
              f"root = {str(ROOT)!r}\n"
              "print(json.dumps(sorted(m.__file__ for m in list(sys.modules.values())\n"
              "    if (getattr(m, '__file__', None) or '').startswith(root + '/')\n"
              "    and m.__name__.split('.')[0] in ('pipeline', 'trainer'))))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert loaded - set(version) == set()
