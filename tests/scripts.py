"""Load a script of the repository (a benchmark, docs/figures.py) as a module, its top level
only: its main() runs under __main__, not here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """``path`` relative to the repository root (or absolute); registered in sys.modules
    under ``name`` (the file's stem) so that its dataclasses can look their module up."""
    path = ROOT / path
    if str(path.parent) not in sys.path:  # its helpers importable, as `python SCRIPT` has them
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
