"""The paired bootstrap (trainer/scoring/bootstrap.py) and ``capstack report --compare``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import cli
from pipeline.core.errors import CapstackError
from trainer.scoring.bootstrap import paired_bootstrap, resample_counts
from trainer.scoring.metrics.base import Metric, Texts
from trainer.scoring.metrics.bleu import Bleu
from trainer.scoring.metrics.cider import Cider
from trainer.scoring.metrics.rouge import RougeL

REFS = {1: ["a dog runs on the grass", "a brown dog running across a field"],
        2: ["two people ride bikes down a street", "cyclists on a city road"],
        3: ["a plate of food with vegetables", "a meal of rice and greens on a plate"],
        4: ["a man flies a kite on the beach", "a kite above the sand and sea"],
        5: ["a cat sleeps on a sofa", "a grey cat asleep on the couch"],
        6: ["a red bus on a wet road", "a double decker bus in the rain"]}
GOOD = {1: "a dog running on the grass", 2: "two people ride bikes on a street",
        3: "a plate of food with rice", 4: "a man flies a kite on the beach",
        5: "a cat sleeps on the couch", 6: "a red bus on the road"}
POOR = {1: "a cat on a table", 2: "a man on a street", 3: "food", 4: "a man on the beach",
        5: "a dog on a sofa", 6: "a car on a road"}


class MeanScore(Metric):
    """A metric whose value is the mean of one score per image (as CIDEr-D's)."""

    values = ("S",)


def texts(candidates: dict[int, str]) -> Texts:
    return Texts(REFS, {k: [v] for k, v in candidates.items()}, dict(candidates))


def test_resample_counts_draw_every_image_count_times_with_replacement():
    counts = resample_counts(7, 50, np.random.default_rng(0))
    assert counts.shape == (50, 7) and (counts.sum(axis=1) == 7).all()
    assert (counts > 1).any() and (counts == 0).any()  # with replacement


def test_a_constant_gain_per_image_is_real():
    rng = np.random.default_rng(1)
    b = rng.uniform(0.2, 0.8, size=(200, 1))
    (d,) = paired_bootstrap(MeanScore(), b + 0.05, b, resamples=500, seed=3)
    assert d.difference == pytest.approx(0.05)
    assert d.low > 0 and d.share == 1.0  # A ahead in every resample


def test_identical_systems_differ_by_nothing_and_each_is_ahead_half_the_time():
    b = np.random.default_rng(2).uniform(size=(100, 1))
    (d,) = paired_bootstrap(MeanScore(), b.copy(), b, resamples=300, seed=0)
    assert d.difference == d.low == d.high == 0 and d.share == 0.5


def test_two_systems_of_equal_quality_give_an_interval_around_zero():
    """A is B with its images' scores shuffled: the same mean, other images."""
    rng = np.random.default_rng(4)
    b = rng.uniform(size=(400, 1))
    a = b[rng.permutation(400)]
    (d,) = paired_bootstrap(MeanScore(), a, b, resamples=1000, seed=5)
    assert d.low < 0 < d.high and 0.3 < d.share < 0.7


def test_a_seed_repeats_exactly_and_another_seed_resamples_otherwise():
    rng = np.random.default_rng(6)
    a, b = rng.uniform(size=(80, 1)), rng.uniform(size=(80, 1))
    first = paired_bootstrap(MeanScore(), a, b, resamples=250, seed=11)
    assert paired_bootstrap(MeanScore(), a, b, resamples=250, seed=11) == first
    assert paired_bootstrap(MeanScore(), a, b, resamples=250, seed=12) != first


def test_systems_over_other_images_are_refused():
    with pytest.raises(CapstackError, match="same images"):
        paired_bootstrap(MeanScore(), np.zeros((3, 1)), np.zeros((4, 1)))


@pytest.mark.parametrize("metric", [Bleu(), Cider(), RougeL()], ids=["bleu", "cider", "rouge"])
def test_the_statistics_summed_over_all_images_give_pycocoevalcaps_values(metric):
    """BLEU from its sufficient statistics, CIDEr-D and ROUGE-L as their images' mean: on the
    full set, the corpus values pycocoevalcap gives."""
    for candidates in (GOOD, POOR):
        values, statistics = metric.scored(texts(candidates))
        again = metric.aggregate(statistics.sum(axis=0), len(candidates))
        assert again == pytest.approx(values, rel=1e-12, abs=1e-15)


def test_bleu_statistics_on_a_subset_are_that_subsets_corpus_bleu():
    subset = {k: GOOD[k] for k in (2, 4, 5)}
    _, full = Bleu().scored(texts(GOOD))
    values, _ = Bleu().scored(Texts({k: REFS[k] for k in subset},
                                    {k: [v] for k, v in subset.items()}, subset))
    rows = [list(GOOD).index(k) for k in subset]
    assert Bleu().aggregate(full[rows].sum(axis=0), 3) == pytest.approx(values, rel=1e-12)


def evaluation(tmp_path, name: str, candidates: dict[int, str], *args: str):
    """`capstack evaluate RESULTS --refs REFS --out DIR [ARGS]`, RESULTS named NAME.json: a
    folder report and report --compare read as they are written (approach NAME)."""
    results = tmp_path / f"{name}.json"
    results.write_text(json.dumps([{"image_id": k, "caption": v}
                                   for k, v in candidates.items()]))
    return scored(tmp_path, results, tmp_path / name, *args)


def scored(tmp_path, results, out, *args: str):
    """`capstack evaluate RESULTS --refs REFS --out OUT [ARGS]` against :data:`REFS`."""
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"images": [{"id": k} for k in REFS], "annotations": [
        {"image_id": k, "caption": c} for k, caps in REFS.items() for c in caps]}))
    done = CliRunner().invoke(cli.main, ["evaluate", str(results), "--refs", str(refs),
                                         "--out", str(out), *args], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return out


@pytest.mark.slow  # evaluations scored with Java (PTB, METEOR)
def test_report_compare_says_which_differences_are_real(tmp_path):
    good, poor = evaluation(tmp_path, "good", GOOD), evaluation(tmp_path, "poor", POOR)
    statistics = json.loads((good / "image_statistics.json").read_text())
    assert statistics["image_ids"] == list(GOOD) and set(statistics["metrics"]) == {
        "bleu", "rouge-l", "cider"}
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(good), str(poor), "--out",
                                         str(tmp_path / "reports"), "--resamples", "400"],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "reports" / "compare.json").read_text())
    by_value = {d["value"]: d for d in written["differences"]}
    assert list(by_value) == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr"]
    for name in ("BLEU-1", "CIDEr", "ROUGE-L"):
        assert by_value[name]["low"] > 0 and by_value[name]["share"] > 0.95, by_value[name]
    good_doc = json.loads((good / "metrics.json").read_text())
    assert by_value["CIDEr"]["a"] == pytest.approx(good_doc["metrics"]["CIDEr"])
    assert by_value["BLEU-4"]["a"] == pytest.approx(good_doc["metrics"]["BLEU-4"])
    assert "| CIDEr |" in done.output and "A ahead in" in done.output
    assert (tmp_path / "reports" / "compare.md").read_text() in done.output + "\n"


@pytest.mark.slow  # evaluations scored with Java (PTB, METEOR)
def test_report_compare_refuses_other_images_and_a_folder_without_statistics(tmp_path):
    good = evaluation(tmp_path, "good", GOOD)
    fewer = evaluation(tmp_path, "fewer", {k: v for k, v in POOR.items() if k != 6})
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(good), str(fewer),
                                         "--out", str(tmp_path / "r")])
    assert done.exit_code == 1 and "not the same images" in done.output
    (fewer / "image_statistics.json").unlink()
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(good), str(fewer),
                                         "--out", str(tmp_path / "r")])
    assert done.exit_code == 1 and "image_statistics.json: not found: evaluate again" in \
        done.output


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_statistics_that_are_a_fifo_or_a_folder_are_named_not_called_missing(tmp_path, kind):
    """report --compare said 'image_statistics.json: not found' of a FIFO (and the read,
    once let through, would have waited for a writer)."""
    from trainer.evaluation.evaluations import read_evaluation

    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({"approach": "a", "metrics": {"CIDEr": 1}}))
    statistics = folder / "image_statistics.json"
    if kind == "fifo":
        os.mkfifo(statistics)
    else:
        statistics.mkdir()
    with pytest.raises(CapstackError, match=rf"^{statistics}: not a regular file \(a "
                                            rf"{'FIFO' if kind == 'fifo' else 'folder'}\), "
                                            r"never read \(expected the image statistics\)$"):
        read_evaluation(folder)
    (os.remove if kind == "fifo" else os.rmdir)(statistics)
    with pytest.raises(CapstackError, match=r"image_statistics.json: not found: evaluate again"):
        read_evaluation(folder)


@pytest.mark.slow  # evaluations scored with Java (PTB, METEOR)
def test_report_versus_xe_marks_whether_each_rl_row_beats_its_xe_row(tmp_path):
    rows = {}
    for name, candidates, training, family in (("xe", POOR, "XE", "cross-entropy"),
                                               ("rl", GOOD, "SCST", "reinforcement")):
        folder = evaluation(tmp_path, name, candidates)
        doc = json.loads((folder / "metrics.json").read_text())
        doc.update(approach="sys", training=training, family=family,
                   setting={"decoder": "top_down", "features": "regions", "seed": 0})
        (folder / "metrics.json").write_text(json.dumps(doc))
        rows[name] = folder
    done = CliRunner().invoke(cli.main, ["report", str(rows["xe"]), str(rows["rl"]),
                                         "--versus-xe", "--out", str(tmp_path / "rep")],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    table = json.loads((tmp_path / "rep" / "report.json").read_text())
    cells = {r["Training"]: r["CIDEr vs XE (95%)"] for r in table["rows"]}
    assert cells["XE"] == "-"
    difference, interval = cells["SCST"].split(" ", 1)
    low, high = (float(x) for x in interval.strip("[]").split(", "))
    good = json.loads((rows["rl"] / "metrics.json").read_text())["metrics"]["CIDEr"]
    poor = json.loads((rows["xe"] / "metrics.json").read_text())["metrics"]["CIDEr"]
    assert float(difference) == pytest.approx(100 * (good - poor), abs=0.05)
    assert 0 < low < float(difference) < high


@pytest.mark.slow  # evaluations scored with Java (PTB, METEOR)
def test_report_baseline_column_compares_every_row_with_the_chosen_one(tmp_path):
    folders = [evaluation(tmp_path, name, candidates)
               for name, candidates in (("poor", POOR), ("good", GOOD), ("good-too", GOOD))]
    done = CliRunner().invoke(cli.main, ["report", str(tmp_path / "poor"),
                                         str(tmp_path / "good*"), "--baseline", str(folders[0]),
                                         "--out", str(tmp_path / "rep")],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    table = json.loads((tmp_path / "rep" / "report.json").read_text())
    column = next(c for c in table["columns"] if c.startswith("CIDEr vs "))
    assert column == "CIDEr vs poor (95%)"
    cells = {r["Approach"]: r[column] for r in table["rows"]}
    assert cells["poor"] == "-" and cells["good"] == cells["good-too"]  # the pattern's two
    low = float(cells["good"].split("[")[1].split(",")[0])
    assert low > 0
    missing = CliRunner().invoke(cli.main, ["report", str(tmp_path / "nothing*"),
                                            "--out", str(tmp_path / "rep")])
    assert missing.exit_code == 1 and "no evaluation matches this pattern" in missing.output


@pytest.mark.slow  # evaluations scored with Java (PTB, METEOR)
def test_report_compare_over_seeds_resamples_every_seeds_images_seed_with_seed(tmp_path):
    for name, candidates in (("good", GOOD), ("poor", POOR)):
        for seed in (0, 1):
            folder = evaluation(tmp_path, f"{name}-s{seed}", candidates)
            doc = json.loads((folder / "metrics.json").read_text())
            doc.update(approach=name, setting={"seed": seed})
            (folder / "metrics.json").write_text(json.dumps(doc))
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(tmp_path / "good-s*"),
                                         str(tmp_path / "poor-s*"), "--resamples", "300",
                                         "--out", str(tmp_path / "r")], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "r" / "compare.json").read_text())
    assert written["a"]["seeds"] == ["0", "1"] and written["b"]["seeds"] == ["0", "1"]
    cider = next(d for d in written["differences"] if d["value"] == "CIDEr")
    assert cider["images"] == 2 * len(GOOD) and cider["low"] > 0
    assert "over seeds 0, 1" in done.output
    refused = CliRunner().invoke(cli.main, ["report", "--compare", str(tmp_path / "good-s*"),
                                            str(tmp_path / "poor-s0"), "--out",
                                            str(tmp_path / "r")])
    assert refused.exit_code == 1 and "compare runs over the same seeds" in refused.output


def written_evaluation(root, name: str, cider: list[float], *, approach="sys", seed=0,
                       training="XE", family="cross-entropy", split="test", recipe="xe",
                       image_ids=None):
    """An evaluation folder as evaluate writes it, of CIDEr-D alone: each image's score (its
    statistics) and their mean (metrics.json), for the report's comparisons without Java."""
    folder = root / name
    folder.mkdir(parents=True)
    ids = image_ids or list(range(1, len(cider) + 1))
    (folder / "metrics.json").write_text(json.dumps({
        "approach": approach, "training": training, "family": family,
        "metrics": {"CIDEr": sum(cider) / len(cider)},
        "setting": {"decoder": "top_down", "features": "regions", "seed": seed, "split": split,
                    "run": f"runs/{name}", "recipe": recipe}}))
    (folder / "image_statistics.json").write_text(json.dumps({
        "image_ids": ids, "metrics": {"cider": [[c] for c in cider]}}))
    return folder


def report(*args) -> tuple:
    """`capstack report ARGS --out OUT`: (exit code, output, report.json or None)."""
    out = args[-1]
    done = CliRunner().invoke(cli.main, ["report", *map(str, args[:-1]), "--out", str(out)])
    written = out / "report.json"
    return done.exit_code, done.output, json.loads(written.read_text()) \
        if written.is_file() else None


XE_SEEDS = {0: [0.5, 0.6, 0.4, 0.5], 1: [0.4, 0.5, 0.5, 0.6], 2: [0.6, 0.4, 0.5, 0.5]}
RL_SEEDS = {0: [0.9, 0.8, 0.7, 0.8], 1: [0.5, 0.5, 0.6, 0.6], 2: [0.6, 0.7, 0.6, 0.5]}


def test_a_row_over_seeds_compares_with_a_row_over_the_same_seeds_only(tmp_path):
    for seed in (0, 1, 2):
        written_evaluation(tmp_path, f"rl-s{seed}", RL_SEEDS[seed], seed=seed, training="SCST",
                           family="reinforcement", recipe="rl")
        written_evaluation(tmp_path, f"xe-s{seed}", XE_SEEDS[seed], seed=seed)
    # against XE over the same seeds: the difference of the rows' means, seed with seed
    code, output, table = report(tmp_path / "xe-s*", tmp_path / "rl-s*", "--versus-xe",
                                 tmp_path / "r1")
    assert code == 0, output
    xe, rl = table["rows"]
    assert (xe["n"], rl["n"]) == (3, 3)
    shown = float(rl["CIDEr vs XE (95%)"].split(" ")[0])
    means = [float(row["CIDEr"].split(" ± ")[0]) for row in (rl, xe)]
    assert shown == pytest.approx(means[0] - means[1], abs=0.11)
    assert any("seed with seed" in note for note in table["notes"])
    # against one seed's XE row: n/a, and why, not seed 0 beside the mean of three
    code, output, table = report(tmp_path / "xe-s0", tmp_path / "rl-s*", "--baseline",
                                 tmp_path / "xe-s0", tmp_path / "r2")
    assert code == 0, output
    column = "CIDEr vs sys XE, seed 0 (95%)"  # the header names the baseline row
    assert [row[column] for row in table["rows"]] == ["-", "n/a"]
    assert table["notes"] == [f"{column}: n/a for sys SCST, seed 0,1,2: seeds 0, 1, 2 against "
                              f"0: a row over seeds compares with a row over the same seeds "
                              f"only (its mean is over all of them)"]
    assert table["notes"][0] in output


def test_a_baseline_of_another_split_is_n_a_in_that_cell_only(tmp_path):
    written_evaluation(tmp_path, "test", XE_SEEDS[0])
    written_evaluation(tmp_path, "rl", RL_SEEDS[0], training="SCST", family="reinforcement",
                       recipe="rl")
    written_evaluation(tmp_path, "val", XE_SEEDS[1], approach="other", split="val",
                       image_ids=[11, 12, 13, 14])
    written_evaluation(tmp_path, "fewer", XE_SEEDS[2][:3], approach="fewer")
    code, output, table = report(tmp_path / "test", tmp_path / "rl", tmp_path / "val",
                                 tmp_path / "fewer", "--baseline", tmp_path / "test",
                                 tmp_path / "r")
    assert code == 0, output
    cells = {row["Approach"] + row["Training"]: row["CIDEr vs sys XE, split test (95%)"]
             for row in table["rows"]}
    assert cells["sysXE"] == "-" and cells["otherXE"] == "n/a" and cells["fewerXE"] == "n/a"
    assert cells["sysSCST"].startswith("+")
    assert any("n/a for other XE, split val: split val against test" in n
               for n in table["notes"])
    assert any("n/a for fewer XE, split test: " in n and "not the same images" in n
               for n in table["notes"])


@pytest.mark.parametrize("rows, problem", [
    ([[0.5], [0.6, 0.1], [0.4], [0.5]], "rows of different lengths or not numbers"),
    ([[0.5, 0.1]] * 4, "got rows of 2"),
    ([["x"]] * 4, "rows of different lengths or not numbers"),
    ([[0.5]] * 3, "got shape [3, 1]"),
])
def test_compare_refuses_image_statistics_of_the_wrong_shape(tmp_path, rows, problem):
    good = written_evaluation(tmp_path, "good", RL_SEEDS[0])
    bad = written_evaluation(tmp_path, "bad", XE_SEEDS[0])
    (bad / "image_statistics.json").write_text(json.dumps(
        {"image_ids": [1, 2, 3, 4], "metrics": {"cider": rows}}))
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(good), str(bad), "--out",
                                         str(tmp_path / "r")])
    assert done.exit_code == 1 and done.exception.__class__ is SystemExit, done.output
    assert f"{bad / 'image_statistics.json'}: metrics.cider: expected one row of 1 numbers " \
           f"per image (4 images)" in done.output and problem in done.output


def test_compare_refuses_bleu_rows_too_narrow_and_an_image_listed_twice(tmp_path):
    good = written_evaluation(tmp_path, "good", RL_SEEDS[0])
    bad = written_evaluation(tmp_path, "bad", XE_SEEDS[0])
    statistics = bad / "image_statistics.json"
    statistics.write_text(json.dumps({"image_ids": [1, 2, 3, 4], "metrics": {
        "cider": [[0.5]] * 4, "bleu": [[5, 5, 4, 3, 2, 1, 3, 2, 1]] * 4}}))  # no correct_4
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(good), str(bad), "--out",
                                         str(tmp_path / "r")])
    assert done.exit_code == 1
    assert f"{statistics}: metrics.bleu: expected one row of 10 numbers per image (4 images), " \
           f"got rows of 9" in done.output
    statistics.write_text(json.dumps({"image_ids": [1, 2, 2, 4], "metrics": {
        "cider": [[0.5]] * 4}}))
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(good), str(bad), "--out",
                                         str(tmp_path / "r")])
    assert done.exit_code == 1 and f"{statistics}: image_ids: an image is listed twice" in \
        done.output


def test_compare_refuses_a_side_of_several_recipes(tmp_path):
    for seed in (0, 1):
        written_evaluation(tmp_path, f"a-s{seed}", RL_SEEDS[seed], seed=seed,
                           recipe=f"lr{seed}")
        written_evaluation(tmp_path, f"b-s{seed}", XE_SEEDS[seed], seed=seed)
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(tmp_path / "a-s*"),
                                         str(tmp_path / "b-s*"), "--out", str(tmp_path / "r")])
    assert done.exit_code == 1 and "are of 2 recipes (setting.recipe), not one experiment " \
                                   "over seeds" in done.output


def test_versus_xe_takes_the_xe_row_decoded_alike_and_names_an_ambiguous_one(tmp_path):
    rl = {"training": "SCST", "family": "reinforcement"}
    for name, beam, scores, trained in (("xe-b5", 5, [0.1] * 4, {}),
                                        ("xe-b1", 1, XE_SEEDS[1], {}),
                                        ("rl-b1", 1, RL_SEEDS[0], rl)):
        folder = written_evaluation(tmp_path, name, scores, **trained)
        doc = json.loads((folder / "metrics.json").read_text())
        doc["setting"]["beam"] = beam
        (folder / "metrics.json").write_text(json.dumps(doc))
    code, output, table = report(tmp_path / "xe-b5", tmp_path / "xe-b1", tmp_path / "rl-b1",
                                 "--versus-xe", tmp_path / "r")
    assert code == 0, output
    # against xe-b1 (0.8 - 0.5), not xe-b5 (0.8 - 0.1)
    assert table["rows"][2]["CIDEr vs XE (95%)"].startswith("+30.0 [")
    assert table["notes"] == []
    (tmp_path / "xe-b5" / "metrics.json").write_text(
        (tmp_path / "xe-b5" / "metrics.json").read_text().replace('"beam": 5', '"beam": 1'))
    code, output, table = report(tmp_path / "xe-b5", tmp_path / "xe-b1", tmp_path / "rl-b1",
                                 "--versus-xe", tmp_path / "r")
    assert code == 0, output
    assert table["rows"][2]["CIDEr vs XE (95%)"] == "n/a"
    assert any("2 XE rows of this approach" in note for note in table["notes"])


# -- any toolkit's captions join the table ------------------------------------------------------

def independent_cider_bootstrap(a: dict[int, str], b: dict[int, str], *, resamples: int,
                                seed: int) -> tuple[float, float, float]:
    """A - B of CIDEr-D and its 95 % interval, computed apart from capstack's scoring and
    bootstrap: pycocoevalcap's scorer on the simply tokenized captions (what scoring does
    without Java), then each resample's images drawn as indices (numpy's generator, drawn
    as trainer/scoring/bootstrap.py draws them, 100 resamples at a time) and averaged."""
    from pycocoevalcap.cider.cider import Cider as Scorer

    from trainer.scoring.text import simple_tokenize

    refs = {k: [simple_tokenize(c) for c in REFS[k]] for k in a}
    per_image = [np.asarray(Scorer().compute_score(refs, {k: [simple_tokenize(c[k])]
                                                           for k in a})[1]) for c in (a, b)]
    gain = per_image[0] - per_image[1]  # each image's A - B, in A's order
    rng, drawn = np.random.default_rng(seed), []
    for start in range(0, resamples, 100):
        draws = rng.integers(0, len(gain), size=(min(100, resamples - start), len(gain)))
        drawn += [float(np.mean(gain[row])) for row in draws]
    low, high = np.quantile(drawn, [0.025, 0.975])
    return float(np.mean(gain)), float(low), float(high)


def test_two_results_files_compare_as_written_and_agree_with_an_independent_bootstrap(
        tmp_path, no_java):
    """`evaluate RESULTS --refs` of two results files, then `report --compare`, no hand edit:
    the approaches are the files' names, and CIDEr's A - B and interval are those of a
    bootstrap computed apart."""
    good, poor = evaluation(tmp_path, "good", GOOD), evaluation(tmp_path, "poor", POOR)
    done = CliRunner().invoke(cli.main, ["report", "--compare", str(good), str(poor), "--out",
                                         str(tmp_path / "r"), "--resamples", "400",
                                         "--seed", "7"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "r" / "compare.json").read_text())
    assert (written["a"]["label"], written["b"]["label"]) == ("good", "poor")
    cider = next(d for d in written["differences"] if d["value"] == "CIDEr")
    difference, low, high = independent_cider_bootstrap(GOOD, POOR, resamples=400, seed=7)
    assert cider["difference"] == pytest.approx(difference, abs=1e-12)
    assert (cider["low"], cider["high"]) == pytest.approx((low, high), abs=1e-12)
    assert low > 0


def test_a_results_evaluation_keeps_its_captions_and_is_a_row_of_the_table(tmp_path, no_java):
    """self-critical.pytorch's eval output ({overall, imgToEval}) and a ranked capstack results
    file, each evaluated with --name: the captions kept in COCO's format beside the
    statistics, and rows of `report` and its --baseline column."""
    sc = tmp_path / "sc_updown_test.json"
    sc.write_text(json.dumps({"overall": {"CIDEr": 0.5}, "imgToEval": {
        str(k): {"image_id": k, "caption": c, "CIDEr": 0.5} for k, c in POOR.items()}}))
    ranked = tmp_path / "results_test.json"
    ranked.write_text(json.dumps([{"image_id": k, "caption": c, "rank": r}
                                  for k in GOOD for r, c in ((1, GOOD[k]), (2, POOR[k]))]))
    theirs = scored(tmp_path, sc, tmp_path / "theirs")
    ours = scored(tmp_path, ranked, tmp_path / "ours", "--name", "top_down beam 5")
    assert json.loads((theirs / "metrics.json").read_text())["approach"] == "sc_updown_test"
    kept = json.loads((ours / "results_given.json").read_text())
    assert kept[:2] == [{"image_id": 1, "caption": GOOD[1], "rank": 1},
                        {"image_id": 1, "caption": POOR[1], "rank": 2}]
    assert json.loads((theirs / "results_given.json").read_text())[0] == \
        {"image_id": 1, "caption": POOR[1]}
    code, output, table = report(theirs, ours, "--baseline", theirs, tmp_path / "rep")
    assert code == 0, output
    cells = {row["Approach"]: row["CIDEr vs sc_updown_test (95%)"] for row in table["rows"]}
    assert cells["sc_updown_test"] == "-" and float(cells["top_down beam 5"].split()[0]) > 0
    refused = CliRunner().invoke(cli.main, ["evaluate", str(sc), "--name", "x"])
    assert refused.exit_code == 2 and "--name: only with --refs" in refused.output


def test_evaluations_over_seeds_that_record_no_seed_are_named(tmp_path, no_java):
    """Comma lists of results evaluations (no seed recorded): the message names what it
    found, not blank seeds."""
    a = [evaluation(tmp_path, f"a{k}", GOOD) for k in (1, 2)]
    b = [evaluation(tmp_path, f"b{k}", POOR) for k in (1, 2)]
    done = CliRunner().invoke(cli.main, ["report", "--compare", ",".join(map(str, a)),
                                         ",".join(map(str, b)), "--out", str(tmp_path / "r")])
    assert done.exit_code == 1
    assert f"A's seeds (none in {a[0]}, none in {a[1]}) and B's (none in {b[0]}, none in " \
           f"{b[1]})" in done.output and "4 record no seed" in done.output
