"""benchmarks/real_data_needs.py on the shipped stages files: a row for every paper block,
disk and GPU hours from the measured rates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import main as capstack
from pipeline.engine.stagefile import load_stages_file
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
FILES = ("configs/coco.yaml", "configs/flickr8k.yaml", "configs/flickr30k.yaml")


@pytest.fixture(scope="module")
def needs():
    return load_script("benchmarks/real_data_needs.py")


@pytest.fixture(scope="module")
def printed(needs, tmp_path_factory):
    """What main() prints and writes with --json, once for the module."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("needs") / "needs.json"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert needs.main(["--json", str(out)]) == 0
    return text.getvalue(), json.loads(out.read_text(encoding="utf-8"))


def block(data: dict, stages_file: str, name: str) -> dict:
    [found] = [b for b in data["blocks"] if b["stages_file"] == stages_file
               and b["block"] == name]
    return found


def test_every_paper_block_of_the_three_files_has_a_row(printed):
    text, data = printed
    for path in FILES:
        tables = [n for n in load_stages_file(ROOT / path, capstack.commands).stages
                  if n.startswith("tables_")]
        assert tables, path
        for name in tables:
            assert block(data, path, name)["training"], (path, name)
    rows = [line for line in text.splitlines() if line.startswith("| `tables_")]
    assert len(rows) == len(data["blocks"])
    words = " ".join(text.split())
    assert "not runs" in words and "the top_down figure applied to all decoders" in words


def test_coco_region_block_holds_a_coco_size_region_store(printed):
    _, data = printed
    bottom_up = block(data, "configs/coco.yaml", "tables_bottom_up")
    [store] = bottom_up["stores"]
    assert store["kind"] == "regions" and store["shape"] == "36×2048 float16"
    assert store["gb"] == pytest.approx(16.7, abs=0.05)
    assert store["weights_file"] == "bua-caffe-frcn-r101_with_attributes.pth"
    assert bottom_up["images"] == 123_287


def test_flickr8k_needs_less_disk_than_the_same_coco_block(printed):
    _, data = printed
    coco = block(data, "configs/coco.yaml", "tables_show_attend_tell")
    flickr8k = block(data, "configs/flickr8k.yaml", "tables_show_attend_tell")
    assert [s["shape"] for s in coco["stores"]] == [s["shape"] for s in flickr8k["stores"]]
    assert 0 < flickr8k["total_disk_gb"] < coco["total_disk_gb"]
    assert flickr8k["training_gpu_h"] < coco["training_gpu_h"]


def test_extraction_hours_are_images_over_the_measured_rate(printed):
    _, data = printed
    # COCO's 123,287 images through extract-regions at the H200's 2.1 images/s
    assert block(data, "configs/coco.yaml", "tables_bottom_up")["extraction_gpu_h"] == \
        pytest.approx(123_287 / 2.1 / 3600)
    # the grid: 14 x 14 cells x 2048 channels x 2 bytes an image, 95 images/s
    stack_cap = block(data, "configs/coco.yaml", "tables_stack_cap")
    [grid] = stack_cap["stores"]
    assert grid["gb"] == pytest.approx(123_287 * 196 * 2048 * 2 / 1e9)
    assert grid["extraction_h"] == pytest.approx(123_287 / 95 / 3600)


def test_training_hours_follow_the_experiment_and_the_stage_overrides(printed):
    _, data = printed
    runs = {t["stage"]: t for t in block(data, "configs/coco.yaml", "tables_bottom_up")
            ["training"]}
    xe, rl = runs["train@bottom_up/top_down"], runs["rl_bottom_up"]
    # configs/coco/bottom_up/top_down.yaml: 50 epochs of 20 images on 113,287 train images
    assert (xe["epochs"], xe["batch_size"], xe["train_images"]) == (50, 20, 113_287)
    assert xe["gpu_h"] == pytest.approx(50 * 5665 * 0.080 / 3600)
    # rl_bottom_up's --set train.epochs=30 and objective.name=scst
    assert (rl["epochs"], rl["objective"], rl["step_s"]) == (30, "scst", 0.119)
    # Show-Attend-Tell's captions drop restval: 82,783 train images
    sat = block(data, "configs/coco.yaml", "tables_show_attend_tell")["training"]
    assert {t["train_images"] for t in sat} == {82_783}


def test_the_readme_papers_table_shows_the_scripts_figures(printed):
    """README's "not yet: DATASET, WEIGHTS, ~N GPU h, ~M GB" is this script's total, rounded."""
    import re

    _, data = printed
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\|.*\| not yet: (\w+), [^|]+, ~(\d+) GPU h, ~(\d+) GB \| "
                      r"`(tables_\w+) -c (configs/\w+\.yaml)`", readme, re.M)
    assert len(rows) == 6
    for dataset, gpu_h, gb, name, path in rows:
        needs = block(data, path, name)
        assert needs["dataset"] == dataset
        assert (int(gpu_h), int(gb)) == (round(needs["total_gpu_h"]),
                                         round(needs["total_disk_gb"])), name
