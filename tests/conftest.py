"""Shared fixtures: tiny Karpathy-format datasets, a capstack project in a tmp dir, and the
session-scoped generated shapes dataset, prepared captions and feature stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner

import cli


def karpathy_image(imgid, split, captions, *, cocoid=None, filepath=None, filename=None):
    image = {
        "filename": filename or f"img_{imgid}.jpg",
        "imgid": imgid,
        "split": split,
        "sentids": [imgid * 10 + k for k in range(len(captions))],
        "sentences": [
            {"tokens": c.split(), "raw": c.capitalize() + ".", "imgid": imgid,
             "sentid": imgid * 10 + k}
            for k, c in enumerate(captions)
        ],
    }
    if cocoid is not None:
        image["cocoid"] = cocoid
    if filepath is not None:
        image["filepath"] = filepath
    return image


@pytest.fixture
def tiny_dataset_json(tmp_path) -> Path:
    """Four images, two captions each; enough for the prepare command."""
    images = [
        karpathy_image(0, "train", ["a red circle", "a circle on the left"]),
        karpathy_image(1, "train", ["a blue square", "a square above a circle"]),
        karpathy_image(2, "val", ["a green star", "a star"]),
        karpathy_image(3, "test", ["a red square", "a square"]),
    ]
    path = tmp_path / "dataset_tiny.json"
    path.write_text(json.dumps({"dataset": "tiny", "images": images}))
    return path


class Capstack:
    """Runs capstack commands in-process against one project folder."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.runner = CliRunner()

    def __call__(self, *args: str, expect_ok: bool = True):
        result = self.runner.invoke(cli.main, [str(a) for a in args], catch_exceptions=False)
        if expect_ok:
            assert result.exit_code == 0, result.output
        return result

    def stage_cmd(self, verb: str, *args: str, stages: str = "stages.yaml", **kw):
        return self(verb, *args, "-c", self.workdir / stages, "--workdir", self.workdir, **kw)

    def statuses(self, stages: str = "stages.yaml") -> dict:
        return json.loads(self.stage_cmd("stages", "--json", stages=stages).output)


@pytest.fixture
def capstack(tmp_path) -> Capstack:
    return Capstack(tmp_path)


@pytest.fixture
def no_java(monkeypatch, tmp_path):
    """PATH without java, so java_missing() reports it and nothing can start Java: scoring
    tokenizes with the simple tokenizer, METEOR reads n/a (fast, and the same on any machine)."""
    from trainer.scoring.text import java_missing

    monkeypatch.setenv("PATH", str(tmp_path))
    assert java_missing() == "java not found"


# -- built once per session: read-only inputs shared by many modules ------------------------
#
# A test that uses one of these may read the folders, never write into them: a test that
# changes a dataset, a prepared folder or a store (or runs code that writes beside its inputs)
# copies it into its own tmp_path first.


class ShapesData(NamedTuple):
    """A prepared shapes dataset (12 train, 4 val, 4 test images) and two stores of it: a grid
    LMDB store and a region HDF5 store (both recording the images' folder as image_root)."""

    root: Path  # holds shapes/ (the images and dataset_shapes.json), prepared/ and the stores
    prepared: Path
    grid: Path
    regions: Path

    @property
    def dataset(self) -> Path:
        return self.root / "shapes" / "dataset_shapes.json"


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> ShapesData:
    """Session-scoped, read-only: :class:`ShapesData` (``_, prepared, grid, regions = data``)."""
    from trainer_fixtures import grid_and_region_stores

    return ShapesData(*grid_and_region_stores(tmp_path_factory.mktemp("shapes_data")))


@pytest.fixture(scope="session")
def small_data(tmp_path_factory) -> tuple[Path, Path]:
    """Session-scoped, read-only: (prepared folder, grid store) of 10 train, 4 val and 2 test
    shapes images."""
    from trainer_fixtures import prepared_with_grid

    return prepared_with_grid(tmp_path_factory.mktemp("small_data"))


@pytest.fixture(scope="session")
def make_shapes(tmp_path_factory):
    """Session-scoped, read-only: ``make_shapes(n_train, n_val, n_test, seed, size=64)`` is the
    folder of a generated shapes dataset, each distinct one written once."""
    from pipeline.demo.shapes import write_shapes_dataset

    made: dict[tuple, Path] = {}

    def make(n_train: int, n_val: int, n_test: int, seed: int, size: int = 64) -> Path:
        key = (n_train, n_val, n_test, seed, size)
        if key not in made:
            root = tmp_path_factory.mktemp("shapes") / "shapes"
            write_shapes_dataset(root, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed,
                                 size=size)
            made[key] = root
        return made[key]

    return make


@pytest.fixture(scope="module")
def shapes(request, make_shapes) -> tuple[Path, Path]:
    """(image root, dataset json) of the shapes dataset the module's ``SHAPES`` names
    (``SHAPES = dict(n_train=6, n_val=1, n_test=2, seed=3)``); read-only, built once a session."""
    root = make_shapes(**request.module.SHAPES)
    return root, root / "dataset_shapes.json"


@pytest.fixture
def coco(request, tmp_path) -> Path:
    """A COCO-style Karpathy json in tmp_path of the module's ``N`` images (else ``len(IDS)``),
    COCO ids from 100."""
    from feature_sources import dataset_json

    module = request.module
    return dataset_json(tmp_path / "dataset_coco.json", getattr(module, "N", None)
                        or len(module.IDS))


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of ``size`` (a tmpfs; root may mount one), later ``resize``d or made
    read-only (process_helpers.remount). Skipped where no tmpfs can be mounted."""
    import subprocess

    mounts = []

    def mount(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)
