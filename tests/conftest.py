"""Shared fixtures: tiny Karpathy-format datasets and a capstack project in a tmp dir."""

from __future__ import annotations

import json
from pathlib import Path

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
