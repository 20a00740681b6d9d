"""Decoding options that cannot work together are refused by name (in a config, an experiment
file, on the command line), and results holding n captions per image are scored on rank one."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from pipeline.core.errors import CapstackError
from trainer.config import EvalConfig, from_dict, load_experiment
from trainer.scoring.references import load_results


# ------------------------------------------------------------------------- refusals


REFUSED = [
    (dict(top_p=0.9), "eval.top_p: the nucleus is what a sample draws from"),
    (dict(top_k=5), "eval.top_k: the k best words"),
    (dict(sample_method="sample"), "eval.sample_method: sample draws one word at a time"),
    (dict(n=6), "eval.n: 6 captions from the beam's best need beam_size >= n"),
    (dict(search="diverse", beam_size=5, group_size=2), "eval.group_size: 2 groups do not divide"),
    (dict(search="diverse", group_size=1), "eval.group_size: diverse beam search splits"),
    (dict(group_size=5), "eval.group_size: groups are diverse beam search's"),
    (dict(diversity_lambda=0.2), "eval.diversity_lambda: the penalty between"),
    (dict(search="greedy", length_penalty="wu_0.2"), "eval.length_penalty: wu_0.2 ranks a beam"),
    (dict(length_penalty="wu"), "eval.length_penalty: expected none, wu_ALPHA or avg_ALPHA"),
    (dict(length_penalty="avg_-1"), "eval.length_penalty: expected none"),
    (dict(search="greedy", temperature=0.5), "eval.temperature: greedy decoding takes"),
    (dict(search="greedy", top_p=0.5), "eval.top_p: greedy decoding takes"),
    (dict(search="greedy", n=3), "eval.n: greedy decoding gives one caption"),
    (dict(bad_endings=["a"]), "eval.bad_endings: a list of words"),
    (dict(remove_bad_endings=True, bad_endings=["a b"]), "eval.bad_endings[0]: expected one"),
    (dict(top_p=0.0), "eval.top_p: must be a finite number above 0 and at most 1"),
    (dict(temperature=0), "eval.temperature: must be a finite number above 0"),
]


@pytest.mark.parametrize("given, message", REFUSED)
def test_combinations_that_cannot_work_are_refused_by_name(given, message):
    with pytest.raises(CapstackError, match="^exp.yaml: " + message.replace("(", r"\(")
                       .replace("[", r"\[").replace("]", r"\]")):
        from_dict(EvalConfig, given, "exp.yaml", "eval.")


def test_an_experiment_file_refuses_them_when_read(tmp_path):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({
        "name": "e", "decoder": {"name": "show_tell"},
        "data": {"captions": "c", "features": ["f"]},
        "eval": {"search": "beam", "beam_size": 2, "n": 3}}))
    with pytest.raises(CapstackError, match=r"exp.yaml: eval.n: 3 captions from the beam's best "
                                            r"need beam_size >= n, got beam_size 2"):
        load_experiment(tmp_path / "exp.yaml")


def test_the_command_line_refuses_decoding_options_for_a_results_file(tmp_path):
    from cli import main

    results, refs = tmp_path / "r.json", tmp_path / "refs.json"
    results.write_text("[]")
    refs.write_text('{"annotations": []}')
    out = CliRunner().invoke(main, ["evaluate", str(results), "--refs", str(refs),
                                    "--n", "2", "--block-trigrams"])
    assert out.exit_code != 0
    assert "--block-trigrams, --n: only for a checkpoint" in out.output


# ------------------------------------------------------------------------- n in results


def test_results_with_ranks_are_scored_on_rank_one(tmp_path):
    from trainer.evaluation.evaluate import results_of
    from trainer.evaluation.predict import Prediction

    preds = [Prediction(7, ["a", "dog"], -1.0, None, None, 1),
             Prediction(7, ["a", "cat"], -2.0, None, None, 2)]
    assert results_of(preds[:1], 1) == [{"image_id": 7, "caption": "a dog"}]  # as before
    ranked = results_of(preds, 2)
    assert ranked == [{"image_id": 7, "caption": "a dog", "rank": 1},
                      {"image_id": 7, "caption": "a cat", "rank": 2}]
    (tmp_path / "r.json").write_text(json.dumps(ranked))
    assert load_results(tmp_path / "r.json") == {7: "a dog"}
    (tmp_path / "bad.json").write_text(json.dumps([{**ranked[0], "rank": 0}]))
    with pytest.raises(CapstackError, match="'rank' must be a whole number from 1"):
        load_results(tmp_path / "bad.json")
