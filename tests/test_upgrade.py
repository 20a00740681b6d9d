"""The old forms trainer/upgrade.py reads that no command test reaches on its own: a run
folder's ``config.json`` in the flat form, a run evaluated where evaluate wrote before, which
fields an old checkpoint is checked for, and ``capstack runs`` listing without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import upgrade
from trainer.checkpoint import FIELDS
from trainer.runs import list_runs

FLAT = {"decoder": "show_tell", "decoder_config": {"embed": 16, "hidden": 16},
        "train": {"epochs": 2, "objective": "xe", "betas": [0.8, 0.999]},
        "data": {"bucket_by_length": False}}


def test_a_saved_config_of_the_flat_form_reads_as_todays():
    """A run's config.json (what a resume compares its recipe with, when the run left no
    checkpoint) in the first form: the components, the moved keys in their places."""

    with pytest.warns(FutureWarning, match="train.betas"):
        saved = upgrade.saved_experiment(FLAT, "runs/old/config.json")
    assert saved["decoder"] == {"name": "show_tell", "embed": 16, "hidden": 16}
    assert saved["objective"] == {"name": "xe"}
    assert saved["train"]["optimizer"] == {"name": "adam", "betas": [0.8, 0.999]}
    assert saved["data"] == {"batching": "images"}
    assert upgrade.saved_experiment([1], "x") == [1]  # no mapping: the schema refuses it


def test_an_old_checkpoint_is_checked_for_its_own_fields():
    assert upgrade.old_checkpoint_fields({"format": "capstack-checkpoint-2"}) is None
    first = upgrade.old_checkpoint_fields({"format": upgrade.FIRST_FORMAT})
    assert first is not None and ("identity.decoder", str, True) in first
    assert {field for field, _, _ in FIELDS} == {"objective", "identity.decoder"}


def test_a_run_evaluated_where_evaluate_wrote_before_is_listed_with_its_score(tmp_path):
    run = tmp_path / "runs" / "old"
    (run / "eval").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"decoder": {"name": "show_tell"},
                                                 "objective": {"name": "xe"},
                                                 "train": {"epochs": 1}}))
    (run / "summary.json").write_text('{"epochs": 1, "best_cider": 0.5, "best_epoch": 0}')
    (run / "eval" / "metrics.json").write_text('{"metrics": {"CIDEr": 0.25}, "split": "test"}')
    (row,) = list_runs(tmp_path)
    assert (row.state, row.best_epoch, row.test_cider) == ("finished", 1, 0.25)
    assert row.evaluated == str(run / "eval" / "metrics.json")


def test_listing_runs_imports_no_torch():
    code = "import sys, trainer.runs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout
    assert out.strip() == "False"
