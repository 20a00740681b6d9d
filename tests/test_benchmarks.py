"""Every benchmark script imports, and runs at a tiny size on the CPU in seconds (its main() on
made-up data): what it uses from capstack still exists and still fits together. They are run by
hand, not timed by the suite, so a renamed function or a changed signature would otherwise be
found only by their user."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from scripts import load_script

BENCHMARKS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))
SCRIPTS = [p for p in BENCHMARKS if p.stem != "common"]  # common.py: what the scripts share


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_a_benchmark_script_imports(script):
    module = load_script(script, f"benchmark_{script.stem}")  # main() runs under __main__
    assert callable(getattr(module, "main", None)), f"{script.name}: no main()"


NEEDS = {  # what a script needs that the suite has not: it is skipped in the smoke run
    "approaches_over_seeds": "`make demo`'s features, captions and runs",
    "distributed": "a minute of torchrun process groups (tests/test_distributed.py runs DDP)",
    "hacap_adversarial": "`make demo`'s prepared captions and features",
    "image_signal": "trained checkpoints (tests/test_image_signal.py tests its measure)",
    "samples_and_decodes": "trained checkpoints (tests/test_samples_and_decodes.py tests it)",
    "parity": "a self-critical.pytorch or MMF checkout (--peer)",
    "peer_steps": "a self-critical.pytorch checkout (--peer)",
    "rehearsal": "minutes at real sizes (the slow test below runs it)",
    "vg_checkpoints": "the VG detector at its real shapes only (extraction --detector vg's)",
}


def tiny(name: str, tmp: Path) -> list[str]:
    """The command line that runs benchmarks/NAME.py small enough for the suite."""
    if name == "butd_source":
        from common import write_images

        return [str(write_images(tmp, 3, size=(64, 48))), str(tmp / "tsv"), "--dim", "8",
                "--boxes", "2-4", "--undecodable", "1"]
    return {
        "cider_reward": ["--n", "20"],
        "decoding": ["--images", "2", "--repeats", "1"],
        "extraction": ["--images", "2", "--backbone", "resnet18", "--image-size", "64",
                       "--grid", "2", "--batch", "2", "--workers", "0", "--device", "cpu"],
        "import": ["--images", "20", "--boxes", "2", "--dim", "8", "--workdir", str(tmp)],
        "page_load": ["--images", "5", "--loads", "1"],
        "real_data_needs": ["--json", str(tmp / "needs.json")],
        "region_selection": ["--boxes", "20", "--classes", "8", "--repeat", "1"],
        "rewards": ["--n", "20", "--meteor", "0"],  # METEOR: a JVM start, 10 s
        "scale": ["--images", "20", "--costs", "prepare,stage_first", "--workdir", str(tmp)],
        "scst_step": ["--steps", "1", "--images", "2", "--hidden", "16", "--device", "cpu"],
        "stage_engine": ["--images", "20", "--file-kb", "1", "--repeats", "1", "--dir", str(tmp)],
        "step_profile": ["--steps", "1", "--images", "2", "--threads", "1"],
        "store_reads": ["--records", "20", "--batch", "5", "--rounds", "2", "--dir", str(tmp)],
        "training": ["--steps", "1", "--device", "cpu", "--hidden", "16",
                     "--setups", "top_down:4:2", "--beam-images", "2", "--beam-batch", "2"],
    }[name]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_a_benchmark_runs_at_a_tiny_size(script, tmp_path, capsys):
    if script.stem in NEEDS:
        pytest.skip(f"{script.name} needs {NEEDS[script.stem]}")
    module = load_script(script, f"benchmark_{script.stem}")
    assert module.main(tiny(script.stem, tmp_path)) in (None, 0)
    assert capsys.readouterr().out.strip(), f"{script.name} printed no figures"


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
