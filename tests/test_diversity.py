"""Diversity figures of predicted captions (distinct-n, vocabulary used, unique captions),
hand-computed; and the report, which reads metrics.json, unchanged by them."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from trainer.evaluation import report as R
from trainer.evaluation.evaluations import load_metrics_file
from trainer.scoring.metrics.diversity import distinct_n, diversity, ngrams

# 4 captions: one repeated, one empty (a beam can end at once)
CAPTIONS = [["a", "dog", "runs"], ["a", "dog", "runs"], ["a", "cat"], []]


def test_ngrams_stay_inside_a_caption():
    assert ngrams(["a", "dog", "runs"], 2) == [("a", "dog"), ("dog", "runs")]
    assert ngrams(["a"], 2) == []
    with pytest.raises(ValueError):
        ngrams(["a"], 0)


def test_distinct_n_by_hand():
    # unigrams: a dog runs | a dog runs | a cat -> 8 in all, 4 distinct
    assert distinct_n(CAPTIONS, 1) == pytest.approx(4 / 8)
    # bigrams: (a dog)(dog runs) | (a dog)(dog runs) | (a cat) -> 5 in all, 3 distinct
    assert distinct_n(CAPTIONS, 2) == pytest.approx(3 / 5)
    # no bigram spans two captions: "a" then "b" has none
    assert distinct_n([["a"], ["b"]], 2) is None
    assert distinct_n([["a"], ["b"]], 1) == 1.0


def test_diversity_by_hand():
    assert diversity(CAPTIONS) == {
        "distinct-1": pytest.approx(0.5), "distinct-2": pytest.approx(0.6),
        "vocab_used": 4,  # a, dog, runs, cat
        "unique_captions": pytest.approx(3 / 4),  # "a dog runs", "a cat", ""
        "mean_length": pytest.approx(8 / 4), "captions": 4}


def test_all_alike_captions_are_the_least_diverse():
    same = diversity([["a", "a"]] * 5)
    assert (same["distinct-1"] == pytest.approx(1 / 10)
            and same["distinct-2"] == pytest.approx(1 / 5))
    assert same["unique_captions"] == pytest.approx(1 / 5) and same["vocab_used"] == 1


def test_no_captions_gives_no_made_up_ratio():
    assert diversity([]) == {"distinct-1": None, "distinct-2": None, "vocab_used": 0,
                             "unique_captions": None, "mean_length": None, "captions": 0}


def test_report_keeps_its_columns_with_diversity_in_metrics_json(tmp_path):
    metrics = {"BLEU-1": 0.75, "BLEU-2": 0.5, "BLEU-3": 0.45, "BLEU-4": 0.362, "METEOR": 0.278,
               "ROUGE-L": 0.565, "CIDEr": 1.135, "SPICE": None}
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"approach": "hacap", "training": "GAN", "family": "adversarial",
                                "metrics": metrics, "unavailable": {"SPICE": "java not found"},
                                "tokenizer": "simple", "images": 4, "epoch": 2,
                                "diversity": diversity(CAPTIONS)}))
    assert load_metrics_file(path) == ("hacap", metrics)
    csv_path, md_path = R.write_report([path], tmp_path / "out")
    frame = pd.read_csv(csv_path, keep_default_na=False)
    assert list(frame.columns) == R.columns()
    assert frame.loc[0, "CIDEr"] == 113.5
    text = md_path.read_text()
    assert text.splitlines()[0] == "| " + " | ".join(R.columns()) + " |"
    assert "distinct" not in text and "vocab_used" not in text
