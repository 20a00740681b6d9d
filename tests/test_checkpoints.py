"""Checkpoints of the first format (flat experiment files) still evaluate and resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.captions.prepared import load_captions
from trainer.checkpoint import FORMAT, load_checkpoint
from trainer.config import load_experiment
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.train import train
from trainer_fixtures import make_prepared, write_feature_store

V1 = Path(__file__).parent / "data" / "checkpoint_v1"


@pytest.mark.slow
def test_a_first_format_run_evaluates_and_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the run recorded paths relative to the folder it ran in
    make_prepared(Path("."), n_train=8, n_val=3, n_test=3, seed=4)
    write_feature_store(Path("grid.lmdb"), load_captions("prepared").image_ids)
    (tmp_path / "runs" / "v1").mkdir(parents=True)
    for name in ("best.pt", "last.pt"):
        shutil.copy(V1 / name, tmp_path / "runs" / "v1" / name)
    ckpt = load_checkpoint("runs/v1/best.pt")
    assert ckpt["format"] == FORMAT
    assert ckpt["experiment"]["decoder"] == {"name": "show_tell", "embed": 16, "hidden": 16}
    assert ckpt["experiment"]["objective"]["name"] == "xe"
    assert ckpt["identity"]["decoder"] == {"name": "show_tell", "embed": 16, "hidden": 16,
                                           "layers": 1, "dropout": 0.5, "image_norm": True,
                                           "image_input": "first"}
    metrics = evaluate_checkpoint("runs/v1", "evals/v1", spice=False)
    assert metrics["beam_size"] == 2 and metrics["training"] == "XE" and metrics["images"] == 3
    Path("v1.yaml").write_text(yaml.safe_dump({
        "name": "v1", "decoder": {"name": "show_tell", "embed": 16, "hidden": 16},
        "data": {"captions": "prepared", "features": ["grid.lmdb"], "seq_per_img": 2},
        "train": {"epochs": 2, "batch_size": 4, "lr": 5e-3},
        "eval": {"beam_size": 2, "figures": 0}}))
    resumed = train(load_experiment("v1.yaml"), Path("runs/v1"), progress=False)
    assert resumed.resumed_at == (1, 0) and resumed.epochs == 2
    assert load_checkpoint("runs/v1/last.pt")["format"] == FORMAT
    assert json.loads(Path("runs/v1/summary.json").read_text())["epochs"] == 2
