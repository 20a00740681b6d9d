"""Every benchmark script imports: what it uses from capstack still exists (they are run by
hand, not by the suite, so a renamed function would otherwise be found only by its user)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from scripts import load_script

BENCHMARKS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_a_benchmark_script_imports(script):
    module = load_script(script, f"benchmark_{script.stem}")  # main() runs under __main__
    assert callable(getattr(module, "main", None)), f"{script.name}: no main()"


@pytest.mark.slow
def test_the_rehearsal_runs_the_real_bottom_up_block_on_the_cpu(tmp_path, capsys):
    """benchmarks/rehearsal.py on 4 made-up images: configs/coco.yaml's BUTD block end to end
    through `capstack run`, at its real sizes (the VG detector at 600×1000, top_down at 1024),
    every stage measured and projected beside real_data_needs.py's estimate."""
    from cli import main as capstack
    from pipeline.core.pointer import read_pointer
    from pipeline.engine.stagefile import load_stages_file

    rehearsal = load_script(BENCHMARKS[0].parent / "rehearsal.py", "benchmark_rehearsal")
    work, figures = tmp_path / "work", tmp_path / "rehearsal.json"
    assert rehearsal.main(["--images", "4", "--device", "cpu", "--workdir", str(work),
                           "--keep", "--json", str(figures)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(figures.read_text(encoding="utf-8"))

    stages = load_stages_file(rehearsal.STAGES_FILE, capstack.commands)
    expected = [*stages.upstream_closure("tables_bottom_up"), "tables_bottom_up"]
    assert [r["stage"] for r in data["rows"]] == expected
    assert {"prepare", "extract_regions", "cider_df", "rl_bottom_up"} <= set(expected)
    # the report of the two evaluations: a top_down row
    with open(work / "coco" / "reports" / "bottom_up" / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0][0] == "Approach" and "top_down" in [row[0] for row in rows[1:]], rows
    # the store in the workdir's features root, nothing in ~/.cache
    store = read_pointer(work / "coco" / "features" / "regions.json")
    assert store.is_relative_to(work / "features")

    header = next(line for line in printed.splitlines() if line.startswith("| stage |"))
    for column in ("wall s", "images/s", "host peak MB", "GPU peak MB", "disk MB", "hours",
                   "needs h", "GB", "needs GB", "differs"):
        assert f" {column} |" in header
    lines = {line.split("|")[1].strip(" `"): line.split("|")[2:-1]
             for line in printed.splitlines() if line.startswith("| `")}
    assert list(lines) == expected
    for name, cells in lines.items():
        assert float(cells[0]) > 0 and float(cells[3].replace(",", "")) > 0, (name, cells)
        assert cells[4].strip() == "n/a (CPU)"
    by_stage = {r["stage"]: r for r in data["rows"]}
    extraction = by_stage["extract_regions"]
    assert extraction["images"] == 4 and extraction["disk_mb"] > 0
    assert extraction["needs_gb"] == pytest.approx(16.7, abs=0.05)  # real_data_needs.py's
    assert extraction["full_h"] > 0 and extraction["full_gb"] > 0
    xe = by_stage["train@bottom_up/top_down"]
    assert xe["images"] == data["data"]["train_images"] and xe["needs_h"] > 0
    assert data["vocab_size"] > 4
