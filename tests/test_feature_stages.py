"""Extraction as stages: rerun skips, a second stages file reuses the shared store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import cli

STAGES = """
params:
  data: {data}
  features_root: {root}
stages:
  extract_grid:
    cmd: capstack extract-grid ${{data}}/dataset_shapes.json ${{data}} --backbone resnet18 \
--weights random --image-size 64 --grid ${{grid}} --workers 0 \
--features-root ${{features_root}} --pointer features/grid.json
    params: {{grid: 2}}
    deps:
      - ${{data}}/dataset_shapes.json
    outs: [features/grid.json]
"""


def run_stage(workdir, *args):
    return subprocess.run([sys.executable, "-m", "cli", "run", "extract_grid", "--workdir",
                           str(workdir), *args], capture_output=True, text=True, cwd=workdir)


@pytest.mark.slow
def test_second_stages_file_reuses_the_store_and_stores_lists_it(tmp_path):
    from pipeline.demo.shapes import write_shapes_dataset

    data = tmp_path / "shapes"
    write_shapes_dataset(data, n_train=6, n_val=1, n_test=1, seed=2, size=64)
    root = tmp_path / "features"
    experiments = []
    for name in ("exp_a", "exp_b"):
        workdir = tmp_path / name
        workdir.mkdir()
        (workdir / "stages.yaml").write_text(STAGES.format(data=data, root=root))
        experiments.append(workdir)
    first = run_stage(experiments[0])
    assert first.returncode == 0, first.stderr
    assert "extracted 8 images" in first.stdout
    again = run_stage(experiments[0])
    assert "Stage 'extract_grid' is up to date, skipping." in again.stdout
    second = run_stage(experiments[1])
    assert second.returncode == 0, second.stderr
    assert "reusing store" in second.stdout and "nothing to extract" in second.stdout
    pointers = [json.loads((w / "features/grid.json").read_text()) for w in experiments]
    assert pointers[0] == pointers[1]
    assert len(list(root.glob("grid-resnet18-*.lmdb"))) == 1

    listing = CliRunner().invoke(cli.main, ["stores", "--features-root", str(root)])
    assert listing.exit_code == 0
    assert "grid, 512-d  8 records" in listing.output
    for workdir in experiments:
        assert f"{workdir / 'stages.yaml'}:extract_grid" in listing.output

    inspected = CliRunner().invoke(cli.main, ["inspect", str(experiments[1] / "features/grid.json"),
                                              "--json"])
    info = json.loads(inspected.output)
    assert info["meta"]["fingerprint"] == pointers[0]["fingerprint"]
    assert info["sample_record"] == {"features": [4, 512]}
    shown = CliRunner().invoke(cli.main, ["inspect", str(experiments[1] / "features/grid.json")])
    lines = [line.strip() for line in shown.output.splitlines()]
    assert "features         ['N', 512] float32" in lines  # random weights: float32
    assert "producer           extract-grid" in lines and "backbone         resnet18" in lines

    verified = CliRunner().invoke(cli.main, ["verify", pointers[0]["store"], "--dataset",
                                             str(data / "dataset_shapes.json")])
    assert verified.exit_code == 0 and "all 8 images" in verified.output
    recorded = CliRunner().invoke(cli.main, ["verify", str(experiments[1] / "features/grid.json")])
    assert recorded.exit_code == 0, recorded.output
    assert f"all 8 images of {(data / 'dataset_shapes.json').resolve()} present" in recorded.output


def test_verify_without_dataset_reads_the_one_the_store_records(tmp_path):
    from pipeline.demo.shapes import write_shapes_dataset
    from pipeline.features.extract.kinds.grid import GridSettings, extract_grid

    data = tmp_path / "shapes"
    write_shapes_dataset(data, n_train=3, n_val=0, n_test=0, seed=0, size=64)
    result = extract_grid(data / "dataset_shapes.json", data,
                          GridSettings("resnet18", "random", 64, 1), root=tmp_path / "f",
                          workers=0, progress=False)
    out = CliRunner().invoke(cli.main, ["verify", str(result.store)])
    assert out.exit_code == 0, out.output
    assert "all 3 images of" in out.output
    (data / "dataset_shapes.json").rename(tmp_path / "moved.json")
    gone = CliRunner().invoke(cli.main, ["verify", str(result.store)])
    assert gone.exit_code == 1
    assert f"{result.store}: the dataset it was made from, " \
        f"{(data / 'dataset_shapes.json').resolve()}, is not there: pass --dataset" in gone.output
    moved = CliRunner().invoke(cli.main, ["verify", str(result.store), "--dataset",
                                          str(tmp_path / "moved.json")])
    assert moved.exit_code == 0 and "all 3 images of" in moved.output


def test_verify_names_the_first_missing_image(tmp_path):
    from pipeline.demo.shapes import write_shapes_dataset
    from pipeline.features.extract.kinds.grid import GridSettings, extract_grid

    small, big = tmp_path / "small", tmp_path / "big"
    write_shapes_dataset(small, n_train=3, n_val=0, n_test=0, seed=0, size=64)
    write_shapes_dataset(big, n_train=5, n_val=0, n_test=0, seed=0, size=64)
    result = extract_grid(small / "dataset_shapes.json", small,
                          GridSettings("resnet18", "random", 64, 1), root=tmp_path / "f",
                          workers=0, progress=False)
    out = CliRunner().invoke(cli.main, ["verify", str(result.store), "--dataset",
                                        str(big / "dataset_shapes.json")])
    assert out.exit_code != 0
    assert f"{result.store}: lacks image 3 of {big / 'dataset_shapes.json'} (2 of 5" in out.output
