"""The report says what it compares: a column for each recorded setting that varies."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from trainer.config import load_experiment
from trainer.evaluation import report as R
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.evaluation.evaluations import recipe_digest
from trainer.train import train
from trainer_fixtures import prepared_with_grid, write_experiment

SCORES = {"BLEU-1": 0.5, "BLEU-2": 0.4, "BLEU-3": 0.3, "BLEU-4": 0.2, "METEOR": 0.2,
          "ROUGE-L": 0.4, "CIDEr": 0.6, "SPICE": None}


def setting(**changed) -> dict:
    return {"run": "runs/a", "decoder": "top_down", "objective": "xe", "reward": "",
            "features": "regions", "seed": 0, "beam": 5, "max_len": 16, "split": "test",
            "max_refs": 0, "recipe": "r1", **changed}


def test_only_the_settings_that_vary_are_columns_in_their_order():
    table = R.metrics_table([("a", SCORES, "XE", "cross-entropy", setting()),
                             ("a", SCORES, "XE", "cross-entropy", setting(beam=1, seed=2))])
    assert list(table.columns)[:4] == ["Approach", "Training", "seed", "beam"]
    assert list(table["beam"]) == ["5", "1"]


def test_decoding_options_are_a_column_when_they_vary():
    table = R.metrics_table([("a", SCORES, "XE", "cross-entropy", setting()),
                             ("a", SCORES, "XE", "cross-entropy",
                              setting(beam=4, decoding="search=diverse group_size=2"))])
    assert list(table.columns)[:4] == ["Approach", "Training", "beam", "decoding"]
    assert list(table["decoding"]) == ["-", "search=diverse group_size=2"]


def test_the_run_is_a_column_only_when_rows_would_read_the_same():
    rows = [("a", SCORES, "XE", "cross-entropy", setting(run="runs/a")),
            ("a", SCORES, "XE", "cross-entropy", setting(run="runs/b"))]
    assert list(R.metrics_table(rows).columns)[:3] == ["Approach", "Training", "run"]
    rows[1] = ("b", SCORES, "XE", "cross-entropy", setting(run="runs/b"))
    assert "run" not in R.metrics_table(rows).columns  # the approach tells them apart


def test_rows_without_a_recorded_setting_still_report():
    table = R.metrics_table([("a", SCORES), ("b", SCORES, "SCST", "reinforcement")])
    assert list(table.columns)[:3] == ["Approach", "Training", "B@1"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("beams")
    prepared, grid = prepared_with_grid(root)
    experiment = write_experiment(root / "exp.yaml", decoder="show_tell", captions=prepared,
                                  features=[grid], epochs=1)
    train(load_experiment(experiment), root / "run", progress=False)
    return root


def test_one_checkpoint_at_two_beams_gives_two_rows_told_apart(checkpoint, tmp_path):
    for beam in (5, 1):
        evaluate_checkpoint(checkpoint / "run", tmp_path / f"beam{beam}", beam_size=beam,
                            figures=0, spice=False)
    doc = json.loads((tmp_path / "beam5" / "metrics.json").read_text())
    assert doc["setting"] == {"experiment": "", "run": str(checkpoint / "run"),
                              "decoder": "show_tell",
                              "objective": "xe", "reward": "", "features": "grid", "seed": 0,
                              "beam": 5, "max_len": 16, "split": "test", "max_refs": 0,
                              "decoding": "", "recipe": recipe_digest(doc["recipe"])}
    # the recipe: the experiment but its seed, name and eval: (the setting's own)
    assert set(doc["recipe"]) == {"decoder", "data", "objective", "train"}
    assert "seed" not in doc["recipe"]["train"] and doc["recipe"]["train"]["lr"] == 5e-3
    R.write_report([tmp_path / "beam5" / "metrics.json", tmp_path / "beam1" / "metrics.json"],
                   tmp_path / "report")
    csv = pd.read_csv(tmp_path / "report" / "metrics.csv")
    assert list(csv.columns)[:3] == ["Approach", "Training", "beam"]
    assert list(csv["beam"]) == [5, 1]
    md = (tmp_path / "report" / "metrics.md").read_text().splitlines()
    assert md[0].startswith("| Approach | Training | beam | B@1 |")
    assert len(set(md[2:4])) == 2  # the two rows read differently
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert written["columns"] == list(csv.columns)
    assert [e["setting"]["beam"] for e in written["evaluations"]] == [5, 1]
    assert [r["beam"] for r in written["rows"]] == ["5", "1"]


def test_runs_over_seeds_are_one_row_of_mean_and_std_with_n():
    a = [("a", {**SCORES, "CIDEr": c}, "XE", "cross-entropy", setting(seed=s, run=f"runs/a{s}"))
         for s, c in ((0, 0.60), (1, 0.64), (2, 0.68))]
    b = ("b", SCORES, "XE", "cross-entropy", setting(decoder="show_tell", run="runs/b"))
    table = R.metrics_table([*a, b])
    assert list(table.columns)[:5] == ["Approach", "Training", "decoder", "seed", "n"]
    first = table.iloc[0]
    assert (first["Approach"], first["seed"], first["n"]) == ("a", "0,1,2", 3)
    assert first["CIDEr"] == "64.0 ± 4.0" and first["B@1"] == "50.0 ± 0.0"
    assert (table.iloc[1]["n"], table.iloc[1]["CIDEr"]) == (1, 60.0)


def test_the_same_seed_twice_stays_two_rows():
    rows = [("a", SCORES, "XE", "cross-entropy", setting(run="runs/x")),
            ("a", SCORES, "XE", "cross-entropy", setting(run="runs/y"))]
    table = R.metrics_table(rows)
    assert len(table) == 2 and "n" not in table.columns and "run" in table.columns


def test_rows_name_their_experiment_and_the_baseline_reads_as_such():
    rows = [("a", SCORES, "XE", "cross-entropy", setting(experiment="")),
            ("a", SCORES, "XE", "cross-entropy", setting(experiment="wide"))]
    table = R.metrics_table(rows)
    assert list(table.columns)[:3] == ["Approach", "Training", "experiment"]
    assert list(table["experiment"]) == ["baseline", "wide"]


def test_an_evaluation_records_the_experiment_it_is_told_and_the_baseline_by_default():
    """``capstack evaluate --experiment NAME`` (a stage passes the engine's ${experiment}):
    the row's experiment; none given, the baseline's ("")."""
    from pathlib import Path

    from trainer.evaluation.evaluate import setting_of

    root = Path(__file__).resolve().parent.parent
    config = load_experiment(root / "configs" / "experiments" / "top_down.yaml", [])
    assert setting_of(config, config.eval, "runs/top_down/best.pt")["experiment"] == ""
    told = setting_of(config, config.eval, "runs/top_down/best.pt", "mc1")
    assert told["experiment"] == "mc1" and told["run"] == "runs/top_down"


def test_seeds_run_as_experiments_are_their_groups_rows_over_seeds():
    # --seeds runs seed 1 as experiment seed1, recorded under its group (the baseline: "")
    rows = [("a", SCORES, "XE", "cross-entropy", setting(experiment="", seed=0, run="runs/a")),
            ("a", SCORES, "XE", "cross-entropy", setting(experiment="", seed=1, run="runs/a")),
            ("a", SCORES, "XE", "cross-entropy", setting(experiment="wide", seed=0))]
    table = R.metrics_table(rows)
    assert list(table["experiment"]) == ["baseline", "wide"]
    assert list(table["n"]) == [2, 1]


@pytest.fixture(scope="module")
def two_recipes(checkpoint):
    """Beside ``checkpoint``'s run (seed 0): one of its experiment file at seed 1 with another
    width and lr, and one at seed 2 as it is; each evaluated by hand."""
    experiment = checkpoint / "exp.yaml"
    for run, changes in (("wide", ["train.seed=1", "decoder.hidden=48", "train.lr=0.002"]),
                         ("seed2", ["train.seed=2"])):
        train(load_experiment(experiment, changes), checkpoint / run, progress=False)
    for run in ("run", "wide", "seed2"):
        evaluate_checkpoint(checkpoint / run, checkpoint / "evals" / run, figures=0,
                            spice=False)
    return checkpoint / "evals"


def test_runs_of_other_recipes_are_not_merged_over_seeds_and_say_what_differs(two_recipes,
                                                                              tmp_path):
    R.write_report([two_recipes / "run" / "metrics.json", two_recipes / "wide" / "metrics.json"],
                   tmp_path)
    csv = pd.read_csv(tmp_path / "metrics.csv")
    assert len(csv) == 2 and "n" not in csv.columns  # two models: two rows, no mean over them
    assert list(csv.columns)[:5] == ["Approach", "Training", "seed", "decoder.hidden",
                                     "train.lr"]
    assert list(csv["decoder.hidden"]) == [32, 48] and list(csv["train.lr"]) == [0.005, 0.002]
    assert "±" not in (tmp_path / "metrics.md").read_text()


def test_runs_of_one_recipe_over_seeds_are_one_row(two_recipes, tmp_path):
    R.write_report([two_recipes / run / "metrics.json" for run in ("run", "wide", "seed2")],
                   tmp_path)
    table = json.loads((tmp_path / "report.json").read_text())
    merged, wide = table["rows"]
    assert (merged["seed"], merged["n"], merged["decoder.hidden"]) == ("0,2", 2, "32")
    assert (wide["seed"], wide["n"], wide["decoder.hidden"]) == ("1", 1, "48")
    assert "±" in merged["CIDEr"]


def test_rows_that_record_no_recipe_stay_one_row_each_and_say_why():
    old = {k: v for k, v in setting().items() if k != "recipe"}
    rows = [("a", SCORES, "XE", "cross-entropy", {**old, "seed": s, "run": f"runs/a{s}"})
            for s in (0, 1)]
    table = R.metrics_table(rows)
    assert list(table["seed"]) == ["0", "1"] and "n" not in table.columns
    assert table.attrs["notes"] == [
        "a (XE), seeds 0, 1: one row each, not merged over seeds: their evaluations record no "
        "recipe (setting.recipe), so nothing says they were trained alike; evaluate them "
        "again to merge them"]


def test_rows_of_other_recipes_unrecorded_show_the_recipe_digest():
    rows = [("a", SCORES, "XE", "cross-entropy", setting(seed=s, run=f"runs/a{s}", recipe=r))
            for s, r in ((0, "0123456789ab"), (1, "ba9876543210"))]
    table = R.metrics_table(rows)
    assert list(table.columns)[:4] == ["Approach", "Training", "seed", "recipe"]
    assert list(table["recipe"]) == ["01234567", "ba987654"]
    named = R.metrics_table(rows, recipes={"0123456789ab": {"train": {"lr": 0.1}},
                                           "ba9876543210": [{"train": {"lr": 0.1}},
                                                            {"train": {"lr": 0.2}}]})
    assert list(named["train.lr"]) == ["0.1", "0.1+0.2"]  # an ensemble's: its runs' values
