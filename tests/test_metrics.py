"""trainer.scoring (tokenizing, references, the metrics registry) and trainer.evaluation.report:
real pycocoevalcap scorers, real Java where present."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from pipeline.core.errors import CapstackError
from trainer.evaluation import report as R
from trainer.evaluation.evaluations import load_metrics_file
from trainer.scoring import metrics as M
from trainer.scoring import references as Refs
from trainer.scoring import text as T
from trainer.scoring.metrics import spice as S


def cider(candidates, references) -> float:
    """CIDEr-D of text tokenized already, as validation scores it."""
    return M.score_tokenized(["cider"], candidates, references)["cider"]

REFS = {
    1: ["A dog runs across the green grass.", "A brown dog running on a lawn."],
    2: ["Two cats sleep on a red sofa.", "A pair of cats napping on a couch."],
    3: ["A man rides a bike down the street.", "A cyclist on a city road."],
    4: ["A plate of food with rice and vegetables.", "Dinner served on a white plate."],
    5: ["A child flies a kite at the beach.", "A kid with a kite by the sea."],
}
PERFECT = {k: v[0] for k, v in REFS.items()}
WORSE = {1: "A cat sits on a table.", 2: "A dog on the grass.", 3: "Food on a plate.",
         4: "A man with a kite.", 5: "Two people on a street."}
NUMERIC = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr")


def _children() -> set[int]:
    """Live java child processes of this test process (Linux /proc); other tests' helpers
    (DataLoader workers, multiprocessing pools) are not METEOR's business."""
    kids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid() and fields[0] != "Z" and "java" in stat:
                kids.add(int(entry.name))
    return kids


@pytest.fixture(scope="module")
def perfect() -> dict:
    """score() once on identical candidates/references, with Java if the machine has it."""
    return M.score(PERFECT, REFS)


# ---------------------------------------------------------------- tokenizing

def test_simple_tokenize_strips_punctuation_and_lowercases():
    assert T.simple_tokenize('  A Dog, "running"!  On the GRASS... (left); ok? ') == \
        "a dog running on the grass left ok"
    assert T.simple_tokenize("A T-shirt -- red.") == "a t-shirt red"


def test_tokenize_reports_its_tokenizer():
    out, name = T.tokenize({7: ["A Dog.", "Two CATS!"]})
    assert name == ("ptb" if T.java_missing() is None else "simple (java not found)")
    assert out == {7: ["a dog", "two cats"]}


# ---------------------------------------------------------------- score()

def test_identical_captions_score_perfectly(perfect):
    m = perfect["metrics"]
    assert set(m) == set(M.value_names())
    for name in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L"):
        assert m[name] == pytest.approx(1.0, abs=1e-6), name
    assert m["CIDEr"] > 0
    assert perfect["images"] == len(PERFECT)
    if T.java_missing():
        pytest.skip("java not found: METEOR cannot be checked")
    assert perfect["tokenizer"] == "ptb"
    assert m["METEOR"] > 0.9


def test_meteor_java_process_is_cleaned_up(perfect):
    if T.java_missing() or not Path("/proc/self/stat").exists():
        pytest.skip("needs java and /proc")
    assert perfect["metrics"]["METEOR"] is not None
    assert _children() == set()


def test_spice_is_unavailable_with_reason_never_a_number(perfect):
    reason = S.spice_missing()
    if reason is None:
        pytest.skip("SPICE jars are installed on this machine")
    assert perfect["metrics"]["SPICE"] is None
    assert perfect["unavailable"]["SPICE"] == reason
    assert "stanford-corenlp-3.6.0.jar" in reason
    assert str(Path("spice") / "lib") in reason


def test_spice_missing_names_files_and_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(S, "_pkg_dir", lambda: tmp_path)
    reason = S.spice_missing()
    for name in ("spice-1.0.jar", "stanford-corenlp-3.6.0.jar",
                 "stanford-corenlp-3.6.0-models.jar"):
        assert name in reason
    assert str(tmp_path / "spice" / "lib") in reason
    (tmp_path / "spice" / "lib").mkdir(parents=True)
    for rel in ("spice/spice-1.0.jar", "spice/lib/stanford-corenlp-3.6.0.jar",
                "spice/lib/stanford-corenlp-3.6.0-models.jar"):
        (tmp_path / rel).write_bytes(b"")
    assert S.spice_missing() == (None if T.java_missing() is None else "java not found")


def test_spice_not_requested(no_java):
    out = M.score(PERFECT, REFS, spice=False)
    assert out["metrics"]["SPICE"] is None
    assert "not requested" in out["unavailable"]["SPICE"]


def test_without_java_meteor_is_none_and_others_still_score(no_java):
    out = M.score(PERFECT, REFS)
    assert out["tokenizer"] == "simple (java not found)"
    assert out["metrics"]["METEOR"] is None
    assert out["unavailable"]["METEOR"] == "java not found"
    assert "java not found" in out["unavailable"]["SPICE"]
    for name in NUMERIC:
        assert isinstance(out["metrics"][name], float), name
    assert out["metrics"]["BLEU-4"] == pytest.approx(1.0, abs=1e-6)


def test_worse_captions_score_lower(no_java):
    good = M.score(PERFECT, REFS)["metrics"]
    bad = M.score(WORSE, REFS)["metrics"]
    for name in ("BLEU-1", "BLEU-4", "CIDEr", "ROUGE-L"):
        assert bad[name] < good[name], name


def test_a_failing_scorer_gives_none_with_reason(no_java, monkeypatch):
    from pycocoevalcap.rouge.rouge import Rouge

    def boom(self, gts, res):
        raise ValueError("rouge exploded")

    monkeypatch.setattr(Rouge, "compute_score", boom)
    out = M.score(PERFECT, REFS)
    assert out["metrics"]["ROUGE-L"] is None
    assert "rouge exploded" in out["unavailable"]["ROUGE-L"]
    for name in ("BLEU-1", "BLEU-4", "CIDEr"):
        assert isinstance(out["metrics"][name], float), name


def test_only_candidate_ids_are_scored(no_java):
    refs = {**REFS, 99: ["an extra image nobody captioned"]}
    out = M.score(PERFECT, refs)
    assert out["images"] == len(PERFECT)
    assert out["metrics"]["BLEU-4"] == pytest.approx(1.0, abs=1e-6)


def test_candidate_without_references_is_an_error():
    with pytest.raises(CapstackError, match="42"):
        M.score({1: "a dog", 42: "a cat"}, REFS)
    with pytest.raises(CapstackError, match="42"):
        cider({42: "a cat"}, REFS)


def test_empty_candidates_is_an_error():
    with pytest.raises(CapstackError):
        M.score({}, REFS)


def test_cider_on_tokenized_text():
    refs = {k: [T.simple_tokenize(c) for c in v] for k, v in REFS.items()}
    perfect = cider({k: v[0] for k, v in refs.items()}, refs)
    worse = cider({k: T.simple_tokenize(v) for k, v in WORSE.items()}, refs)
    assert isinstance(perfect, float)
    assert perfect > worse >= 0


# ---------------------------------------------------------------- files

def _write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ({"image_id": 1, "caption": "x"}, "list"),
    ([{"image_id": 1, "caption": "x"}, {"image_id": 2}], "entry 1"),
    ([{"image_id": "1", "caption": "x"}], "image_id"),
    ([{"image_id": 1, "caption": "x"}, {"image_id": 1, "caption": "y"}], "duplicate"),
    ([{"image_id": 7, "caption": "x", "rank": 2}] * 2, "entry 1: rank 2 of image_id 7 twice"),
    ([{"image_id": 7, "caption": "x", "rank": 2}], "image_id 7 has captions but none of rank 1"),
    ({"overall": {}, "imgToEval": {"7": {"image_id": 7}}}, "entry 0: missing 'caption'"),
])
def test_load_results_errors_name_the_file(tmp_path, content, problem):
    path = _write(tmp_path / "results.json", content)
    with pytest.raises(CapstackError) as err:
        Refs.load_results(path)
    assert str(path) in str(err.value)
    assert problem in str(err.value)


def test_load_results_missing_file(tmp_path):
    with pytest.raises(CapstackError, match="not found"):
        Refs.load_results(tmp_path / "nope.json")


def _refs_doc(refs: dict[int, list[str]]) -> dict:
    return {"images": [{"id": k, "file_name": f"{k}.jpg"} for k in refs],
            "annotations": [{"image_id": k, "id": k * 10 + j, "caption": c}
                            for k, caps in refs.items() for j, c in enumerate(caps)]}


@pytest.mark.parametrize("content, problem", [
    ("[]", "annotations"),
    ({"images": [], "annotations": "x"}, "annotations"),
    ({"annotations": [{"image_id": 1}]}, "annotation 0"),
    ({"images": [{"id": 1}], "annotations": [{"image_id": 2, "caption": "x"}]}, "image_id 2"),
])
def test_load_references_errors_name_the_file(tmp_path, content, problem):
    path = _write(tmp_path / "refs_test.json", content)
    with pytest.raises(CapstackError) as err:
        Refs.load_references(path)
    assert str(path) in str(err.value)
    assert problem in str(err.value)


def test_score_files(tmp_path, no_java):
    results = _write(tmp_path / "results.json",
                     [{"image_id": k, "caption": c} for k, c in PERFECT.items()])
    refs = _write(tmp_path / "refs_test.json", _refs_doc(REFS))
    assert Refs.load_references(refs) == REFS
    out, statistics = M.score_files(results, refs)
    assert statistics["image_ids"] == list(PERFECT)  # the bootstrap's: one row per image
    assert set(statistics["metrics"]) == {"bleu", "rouge-l", "cider"}
    assert all(len(rows) == len(PERFECT) for rows in statistics["metrics"].values())
    assert out["results"] == str(results) and out["references"] == str(refs)
    assert out["images"] == len(PERFECT)
    assert out["metrics"]["BLEU-1"] == pytest.approx(1.0, abs=1e-6)


def test_evaluate_results_with_out_writes_what_it_says(tmp_path, no_java):
    """Repro: `capstack evaluate RESULTS --refs REFS --out DIR` printed '-> DIR/metrics.json'
    and wrote nothing; checkpoint-only options were silently ignored."""
    from click.testing import CliRunner

    from cli import main

    results = _write(tmp_path / "results.json",
                     [{"image_id": k, "caption": c} for k, c in PERFECT.items()])
    refs = _write(tmp_path / "refs_test.json", _refs_doc(REFS))
    out = tmp_path / "scored"
    result = CliRunner().invoke(main, ["evaluate", str(results), "--refs", str(refs),
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"-> {out}/metrics.json" in result.output
    written = json.loads((out / "metrics.json").read_text())
    assert written["metrics"]["BLEU-1"] == pytest.approx(1.0, abs=1e-6)
    assert written["results"] == str(results) and written["images"] == len(PERFECT)
    refused = CliRunner().invoke(main, ["evaluate", str(results), "--refs", str(refs),
                                        "--beam", "3"])
    assert refused.exit_code == 2 and "--beam: only for a checkpoint" in refused.output


SEVEN = {7: ["a man rides a horse on a beach", "a person on a horse by the sea",
             "a rider and a horse near the water", "someone riding a brown horse",
             "a horse carries a man along the shore", "two dogs play with a red ball",
             "a man on a horse at the beach"]}


def test_max_refs_scores_against_each_images_first_references(tmp_path, no_java):
    """7 references, the candidate equal to the 6th: every n-gram of it is matched while the
    6th is scored (BLEU-4 1), and not once only the first 5 are (Show-Attend-Tell's rule)."""
    from click.testing import CliRunner

    from cli import main

    candidate = {7: SEVEN[7][5]}
    assert Refs.first_references(SEVEN, 5) == {7: SEVEN[7][:5]}
    assert Refs.first_references(SEVEN, 0) == SEVEN
    every, first6, first5 = (M.score(candidate, SEVEN, spice=False, max_refs=n)
                             for n in (0, 6, 5))
    assert every["metrics"]["BLEU-4"] == pytest.approx(1.0, abs=1e-6)
    assert first6["metrics"] == every["metrics"]
    assert first5["metrics"]["BLEU-1"] < 0.3 and first5["metrics"]["BLEU-4"] < 1e-4
    assert (every["max_refs"], first5["max_refs"]) == (0, 5)
    results = _write(tmp_path / "results.json", [{"image_id": 7, "caption": SEVEN[7][5]}])
    refs = _write(tmp_path / "refs.json", _refs_doc(SEVEN))
    done = CliRunner().invoke(main, ["evaluate", str(results), "--refs", str(refs),
                                     "--max-refs", "5", "--out", str(tmp_path / "e")])
    assert done.exit_code == 0, done.output
    assert "first 5 references" in done.output
    written = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert written["max_refs"] == 5 and written["metrics"] == first5["metrics"]


def test_score_files_unknown_id_names_file_and_id(tmp_path):
    results = _write(tmp_path / "results.json", [{"image_id": 77, "caption": "a dog"}])
    refs = _write(tmp_path / "refs_test.json", _refs_doc(REFS))
    with pytest.raises(CapstackError) as err:
        M.score_files(results, refs)
    assert "77" in str(err.value) and str(results) in str(err.value)


# ---------------------------------------------------------------- report

SCORED = {"BLEU-1": 0.7512, "BLEU-2": 0.5, "BLEU-3": 0.45, "BLEU-4": 0.362,
          "METEOR": 0.2781, "ROUGE-L": 0.5649, "CIDEr": 1.135, "SPICE": None}


def test_metrics_table_percent_one_decimal_and_na():
    table = R.metrics_table([("Up-Down", SCORED), ("Plain", dict(SCORED, METEOR=None))])
    assert list(table.columns) == R.columns()
    first = table.iloc[0]
    assert first["Approach"] == "Up-Down"
    assert (first["B@1"], first["B@4"], first["CIDEr"], first["METEOR"]) == (75.1, 36.2, 113.5,
                                                                            27.8)
    assert first["SPICE"] == "n/a"
    assert table.iloc[1]["METEOR"] == "n/a"


def _metrics_json(path: Path, approach: str, metrics: dict, unavailable: dict) -> Path:
    return _write(path, {"approach": approach, "metrics": metrics, "unavailable": unavailable,
                         "tokenizer": "ptb", "images": 5})


def test_write_report(tmp_path):
    spice_reason = "Stanford CoreNLP jar(s) stanford-corenlp-3.6.0.jar missing: put them in /x/lib"
    a = _metrics_json(tmp_path / "a.json", "Up-Down", SCORED, {"SPICE": spice_reason})
    b = _metrics_json(tmp_path / "b.json", "Plain | grid", dict(SCORED, METEOR=None),
                      {"SPICE": spice_reason, "METEOR": "java not found"})
    csv_path, md_path = R.write_report([a, b], tmp_path / "out" / "report")
    assert csv_path == tmp_path / "out" / "report" / "metrics.csv"

    frame = pd.read_csv(csv_path)
    assert list(frame.columns) == R.columns()
    assert list(frame["Approach"]) == ["Up-Down", "Plain | grid"]
    assert frame.loc[0, "B@4"] == 36.2 and frame.loc[0, "CIDEr"] == 113.5
    assert pd.read_csv(csv_path, keep_default_na=False).loc[0, "SPICE"] == "n/a"

    lines = md_path.read_text().splitlines()
    assert lines[0] == "| " + " | ".join(R.columns()) + " |"
    assert lines[1] == "|" + "---|" * len(R.columns())
    assert lines[2].startswith("| Up-Down |  | 75.1 | 50.0 | 45.0 | 36.2 | 27.8 | 56.5 | 113.5 "
                               "| n/a |")
    assert "Plain \\| grid" in lines[3]
    assert [ln for ln in lines if ln.startswith("SPICE:")] == [f"SPICE: n/a — {spice_reason}"]
    assert "METEOR: n/a — java not found" in lines
    assert not [p for p in md_path.parent.iterdir() if p.name.startswith(".")]


def test_report_has_an_xe_block_and_an_rl_block(tmp_path):
    """One block per objective family that evaluate recorded (cross-entropy first, then
    reinforcement, then any other family), rows in their given order within a block."""
    families = {"XE": "cross-entropy", "SCST": "reinforcement", "C2F": "reinforcement",
                "GAN": "adversarial"}
    files = [_write(tmp_path / f"{name}.json", {"approach": approach, "objective": label.lower(),
                                                "training": label, "family": families[label],
                                                "epoch": 0 if name == "a" else 3,
                                                "metrics": dict(SCORED, CIDEr=cider)})
             for name, approach, label, cider in [
                 ("a", "top_down", "SCST", 1.1), ("e", "hacap", "GAN", 1.2),
                 ("b", "top_down", "XE", 1.1), ("c", "stack_cap", "C2F", 1.3),
                 ("d", "stack_cap", "XE", 1.15)]]
    csv_path, md_path = R.write_report(files, tmp_path / "out")
    frame = pd.read_csv(csv_path)
    # XE block first, order kept
    assert list(frame["Training"]) == ["XE", "XE", "SCST", "C2F", "GAN"]
    assert list(frame["CIDEr"]) == [110.0, 115.0, 110.0, 130.0, 120.0]
    text = md_path.read_text()
    xe, rest = text.split("**Reinforcement with CIDEr-D rewards (SCST, C2F)**")
    rl, other = rest.split("**Adversarial training**")
    assert xe.startswith("**Cross-entropy training**")
    assert "| top_down | XE |" in xe and "| stack_cap | XE |" in xe and "SCST" not in xe
    assert "| top_down | SCST |" in rl and "| stack_cap | C2F |" in rl and "| XE |" not in rl
    assert "| hacap | GAN |" in other and "| XE |" not in other
    # a run whose best is still the checkpoint it started from says so
    assert ("top_down (SCST): no epoch beat the checkpoint it started from on validation CIDEr; "
            "the row is that start checkpoint") in other and "stack_cap (C2F): no" not in text


def test_load_metrics_file(tmp_path):
    path = _metrics_json(tmp_path / "m.json", "Up-Down", SCORED, {})
    assert load_metrics_file(path) == ("Up-Down", SCORED)
    bad = _write(tmp_path / "bad.json", {"metrics": SCORED})
    with pytest.raises(CapstackError, match="approach") as err:
        load_metrics_file(bad)
    assert str(bad) in str(err.value)
    worse = _write(tmp_path / "worse.json", {"approach": "x", "metrics": {"CIDEr": "high"}})
    with pytest.raises(CapstackError, match="CIDEr"):
        load_metrics_file(worse)


def test_write_report_real_scores(tmp_path, perfect):
    path = _write(tmp_path / "metrics.json", dict(perfect, approach="copy-refs"))
    csv_path, md_path = R.write_report([path], tmp_path)
    assert list(pd.read_csv(csv_path).columns) == R.columns()
    if perfect["metrics"]["SPICE"] is None:
        assert "SPICE: n/a — " in md_path.read_text()


def test_meteor_failing_mid_score_does_not_hang_or_leak(monkeypatch):
    """compute_score raising while it holds METEOR's lock: None + reason, Java stopped."""
    if T.java_missing() or not Path("/proc/self/stat").exists():
        pytest.skip("needs java and /proc")
    from pycocoevalcap.meteor.meteor import Meteor

    def boom(self, hypothesis, references):
        raise RuntimeError("meteor pipe broke")

    monkeypatch.setattr(Meteor, "_stat", boom)
    out = M.score(PERFECT, REFS, spice=False)
    assert out["metrics"]["METEOR"] is None
    assert "meteor pipe broke" in out["unavailable"]["METEOR"]
    assert out["metrics"]["CIDEr"] > 0
    import gc
    gc.collect()  # runs Meteor.__del__, which takes the lock: must not block
    assert _children() == set()


BREAKERS = ["\r", "\u2028", "\u2029", "\u0085", "\n", " ||| "]


def test_a_line_breaker_inside_a_caption_scores_as_a_space():
    """Repro: one '\\r' in one of 10 results made the PTB tokenizer emit an extra line, and every
    later caption was scored against another image's references (CIDEr 318.9 -> 35.3). Each
    breaker here sits in one candidate and in one reference; without the fix, '\\r', U+2028,
    U+2029 and '|||' each changed the scores."""
    if T.java_missing():
        pytest.skip("java: the PTB tokenizer and METEOR are what this guards")
    words = ["a red circle", "two blue squares", "a green triangle", "one small star",
             "a big yellow circle", "three red dots", "a purple square", "an orange ring",
             "a thin black line", "two white stars", "a blue ring", "four green dots"]
    refs = {i: [w, f"{w} on grey", f"there is {w}"] for i, w in enumerate(words)}
    clean = {i: w for i, w in enumerate(words)}
    broken = {**clean, **{i: clean[i].replace(" ", b, 1) for i, b in enumerate(BREAKERS)}}
    refs_broken = {**refs, **{6 + i: [refs[6 + i][0].replace(" ", b, 1), *refs[6 + i][1:]]
                              for i, b in enumerate(BREAKERS)}}
    want = {k: v for k, v in M.score(clean, refs, spice=False)["metrics"].items() if v is not None}
    got = {k: v for k, v in M.score(broken, refs_broken, spice=False)["metrics"].items()
           if v is not None}
    assert got == pytest.approx(want) and "METEOR" in got
    assert want["BLEU-1"] > 0.99  # every caption met its own references
