"""Every benchmark script imports: what it uses from capstack still exists (they are run by
hand, not by the suite, so a renamed function would otherwise be found only by its user)."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripts import load_script

BENCHMARKS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_a_benchmark_script_imports(script):
    module = load_script(script, f"benchmark_{script.stem}")  # main() runs under __main__
    assert callable(getattr(module, "main", None)), f"{script.name}: no main()"
