"""Evaluation-time decoding options (trainer/decoding): each changes decoding as it should on small
decoders whose next-word distributions are set by hand (tests/decoding_models.py), the defaults
decode exactly as before, and every search is the one beam search."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from decoding_models import (ID, VOCAB, Random, Timed, captions,
                             context, markov, model_score, options, trimmed)
from pipeline.captions.vocab import EOS_ID
from pipeline.core.errors import CapstackError
from trainer.batch import EvalBatch
from trainer.config import EvalConfig, from_dict
from trainer.bounds import MAX_CAPTION_WORDS
from trainer.decoding import beam_search, greedy, tempered
from trainer.decoding import BAD_ENDINGS, Beam, DecodingConfig, decode, filtered
from trainer.decoding.rules import MAX_WU_ALPHA, length_penalized
from trainer.evaluation.predict import predict


# ------------------------------------------------------------------------- defaults


@pytest.mark.parametrize("seed", range(4))
def test_defaults_decode_byte_identically_to_the_old_entry_points(seed):
    model = Random(seed)
    ctx = context(model, 3)
    assert DecodingConfig().options() == Beam(5, 16)  # plain hooks: the settling search
    new = decode(model, ctx, DecodingConfig(), VOCAB)
    old = beam_search(model, ctx, 5, 16)
    assert torch.equal(new.tokens, old.tokens) and torch.equal(new.logprobs, old.logprobs)
    new1 = decode(model, ctx, DecodingConfig(beam_size=1, max_len=7), VOCAB)
    assert torch.equal(new1.tokens, greedy(model, ctx, 7).tokens)
    assert torch.equal(decode(model, ctx, DecodingConfig(search="greedy"), VOCAB).tokens,
                      greedy(model, ctx, 16).tokens)
    # predict() with the experiment's eval: block at its defaults, as evaluate now calls it,
    # against predict() as it was called before (beam_size and max_len alone)
    batch = EvalBatch([10, 11, 12], torch.arange(3.0)[:, None, None],
                      torch.ones(3, 1, dtype=torch.bool), None)
    for beam in (5, 1):
        before = predict(model, VOCAB, [batch], torch.device("cpu"), beam_size=beam, max_len=16)
        after = predict(model, VOCAB, [batch], torch.device("cpu"),
                        EvalConfig(beam_size=beam).decoding)
        assert [(p.image_id, p.words, p.logprob, p.rank) for p in before] == \
            [(p.image_id, p.words, p.logprob, p.rank) for p in after]


def test_the_eval_block_keeps_its_defaults_and_reads_the_new_options():
    assert (EvalConfig().beam_size, EvalConfig().max_len, EvalConfig().n) == (5, 16, 1)
    assert EvalConfig().describe() == ""
    s = from_dict(EvalConfig, {"beam_size": 4, "search": "diverse", "group_size": 2,
                               "length_penalty": "wu_0.2", "n": 2}, "exp.yaml", "eval.")
    assert s.decoding == DecodingConfig(beam_size=4, search="diverse", group_size=2,
                                        length_penalty="wu_0.2", n=2)
    assert s.describe() == "search=diverse length_penalty=wu_0.2 group_size=2 n=2"


@pytest.mark.parametrize("seed", range(4))
def test_the_general_searches_without_a_rule_are_the_fast_ones(seed):
    """An empty bad-endings list forbids nothing but takes the general beam search and the
    general word-by-word one: they decode what beam_search and greedy do."""
    model = Random(seed)
    ctx = context(model, 3)
    nothing = dict(remove_bad_endings=True, bad_endings=[])
    for k in (2, 5):
        general = decode(model, ctx, options(beam_size=k, max_len=6, **nothing), VOCAB)
        fast = beam_search(model, ctx, k, 6)
        assert torch.equal(general.tokens, trimmed(fast.tokens))
        assert torch.allclose(general.logprobs, fast.logprobs[:, :general.tokens.shape[1]])
    general = decode(model, ctx, options(search="greedy", max_len=6, **nothing), VOCAB)
    assert torch.equal(general.tokens, greedy(model, ctx, 6).tokens)


# ------------------------------------------------------------------------- each option


# "dog runs dog runs dog" the most probable caption: its last word repeats "dog runs dog"
LOOP = [{"dog": 0.95, "cat": 0.05}, {"runs": 0.95, "on": 0.05}, {"dog": 0.95, "cat": 0.05},
        {"runs": 0.95, "on": 0.05}, {"dog": 0.9, "grass": 0.09, "cat": 0.01}]


def trigrams(words: list[str]) -> list[tuple]:
    return [tuple(words[i:i + 3]) for i in range(len(words) - 2)]


SEARCHES = [dict(search="greedy"), dict(beam_size=3),
            dict(search="greedy", sample_method="sample", n=40)]


@pytest.mark.parametrize("how", SEARCHES)
def test_trigram_blocking_forbids_a_repeated_trigram(how):
    torch.manual_seed(0)
    model = Timed(LOOP)
    ctx = context(model)
    free = captions(decode(model, ctx, options(max_len=8, **how), VOCAB))
    blocked = captions(decode(model, ctx, options(max_len=8, block_trigrams=True, **how), VOCAB))
    if "sample_method" not in how:
        assert free[0] == ["dog", "runs", "dog", "runs", "dog"]
        assert blocked[0] == ["dog", "runs", "dog", "runs", "grass"]
    assert any(len(set(trigrams(c))) < len(trigrams(c)) for c in free)
    assert all(len(set(trigrams(c))) == len(trigrams(c)) for c in blocked)


@pytest.mark.parametrize("how", SEARCHES)
def test_no_repeats_forbids_a_word_twice_in_a_row(how):
    torch.manual_seed(0)
    model = Timed([{"dog": 0.95, "cat": 0.05}, {"dog": 0.9, "runs": 0.1}])
    ctx = context(model)
    free = captions(decode(model, ctx, options(max_len=5, **how), VOCAB))
    kept = captions(decode(model, ctx, options(max_len=5, no_repeats=True, **how), VOCAB))
    assert any(a == b for c in free for a, b in zip(c, c[1:]))
    assert all(a != b for c in kept for a, b in zip(c, c[1:]))
    if "sample_method" not in how:
        assert (free[0], kept[0]) == (["dog", "dog"], ["dog", "runs"])


A_ENDS = {"<bos>": {"the": 1.0}, "the": {"dog": 1.0}, "dog": {"runs": 0.7, "on": 0.3},
          "runs": {"a": 0.8, "<eos>": 0.2}, "a": {"<eos>": 0.9, "cat": 0.1},
          "on": {"grass": 1.0}, "grass": {"<eos>": 1.0}, "cat": {"<eos>": 1.0}}


@pytest.mark.parametrize("how", SEARCHES)
def test_bad_endings_never_end_a_caption_with_a(how):
    torch.manual_seed(0)
    model = markov(A_ENDS)
    ctx = context(model)
    free = captions(decode(model, ctx, options(max_len=6, **how), VOCAB))
    removed = captions(decode(model, ctx, options(max_len=6, remove_bad_endings=True, **how),
                              VOCAB))
    assert any(c[-1] == "a" for c in free)
    assert all(c[-1] not in BAD_ENDINGS for c in removed)
    if how.get("sample_method") is None:
        assert free[0] == ["the", "dog", "runs", "a"]
        assert removed[0] == {"greedy": ["the", "dog", "runs", "a", "cat"],  # "a" -> "cat"
                              "beam": ["the", "dog", "on", "grass"]}[how.get("search", "beam")]


def test_bad_endings_take_a_given_list_and_hold_at_the_length_cut():
    model = markov(A_ENDS)
    ctx = context(model)
    got = captions(decode(model, ctx, options(search="greedy", max_len=6,
                                              remove_bad_endings=True, bad_endings=["runs"]),
                          VOCAB))
    assert got[0] == ["the", "dog", "runs", "a"]  # "a" is not in the given list
    no_runs = captions(decode(model, ctx, options(beam_size=3, max_len=6, remove_bad_endings=True,
                                                  bad_endings=["runs", "a"]), VOCAB))
    assert no_runs[0][-1] not in ("runs", "a")
    # cut at 4 words, the greedy caption would end "runs a": the last word may not be bad
    cut = captions(decode(model, ctx, options(search="greedy", max_len=4,
                                              remove_bad_endings=True), VOCAB))
    assert len(cut[0]) <= 4 and cut[0][-1] not in BAD_ENDINGS


FLAT = {"<bos>": {"dog": 0.4, "cat": 0.3, "grass": 0.2, "runs": 0.1}}


@pytest.mark.parametrize("method", ["sample", "gumbel"])
def test_top_k_never_draws_outside_the_k_best(method):
    torch.manual_seed(0)
    model = markov(*[FLAT] * 8)  # 8 images x 50 draws
    drawn = Counter(c[0] for c in captions(decode(
        model, context(model, 8), options(search="greedy", sample_method=method, top_k=2, n=50,
                                          max_len=1), VOCAB)))
    assert set(drawn) == {"dog", "cat"}
    everything = Counter(c[0] for c in captions(decode(
        model, context(model, 8), options(search="greedy", sample_method=method, n=50,
                                          max_len=1), VOCAB)))
    assert set(everything) == {"dog", "cat", "grass", "runs"}
    assert everything["dog"] / 400 == pytest.approx(0.4, abs=0.07)


@pytest.mark.parametrize("p, nucleus", [(0.5, {"dog", "cat"}), (0.35, {"dog"}),
                                        (0.8, {"dog", "cat", "grass"})])
def test_top_p_never_draws_outside_the_nucleus(p, nucleus):
    """The nucleus: the most probable words until their probability reaches p (the word that
    crosses p included)."""
    torch.manual_seed(1)
    model = markov(*[FLAT] * 8)
    drawn = Counter(c[0] for c in captions(decode(
        model, context(model, 8), options(search="greedy", sample_method="sample", top_p=p,
                                          n=50, max_len=1), VOCAB)))
    assert set(drawn) == nucleus


def test_filters_renormalise_the_tempered_distribution():
    logp = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    assert torch.isinf(filtered(logp, 1.0, 3, 1.0)[0, 3])
    # at temperature 0.5 the weights are 16:9:4:1 (/30): the nucleus of 0.8 is two words
    kept = torch.isfinite(filtered(logp, 0.5, 0, 0.8))[0].tolist()
    assert kept == [True, True, False, False]


def test_temperature_sharpens_sampling():
    torch.manual_seed(2)
    model = markov(*[FLAT] * 4)
    cold = Counter(c[0] for c in captions(decode(
        model, context(model, 4), options(search="greedy", sample_method="sample",
                                          temperature=0.1, n=50, max_len=1), VOCAB)))
    assert cold["dog"] >= 190


TOO_SMALL = [1e-39, 1e-45, 1e-300]  # below float32's normal numbers, its smallest, and 0 in it


@pytest.mark.parametrize("temperature", TOO_SMALL)
@pytest.mark.parametrize("how", [dict(beam_size=3), dict(beam_size=3, length_penalty="wu_1"),
                                 dict(search="greedy", sample_method="sample", n=3),
                                 dict(search="greedy", sample_method="gumbel", n=3),
                                 dict(search="greedy", sample_method="sample", top_k=2, n=3)])
def test_a_temperature_too_small_for_float32_decodes_its_limit(temperature, how):
    """log p / T leaves float32 for every word (NaN scores: empty captions, or multinomial's
    'probability tensor contains inf'): the limit as T falls to 0 is the most probable word."""
    torch.manual_seed(0)
    model = Timed(LOOP)
    ctx = context(model)
    most_probable = captions(greedy(model, ctx, 8))[0]
    assert most_probable == ["dog", "runs", "dog", "runs", "dog"]
    got = decode(model, ctx, options(max_len=8, temperature=temperature, **how), VOCAB)
    assert captions(got)[0] == most_probable
    if "sample_method" in how:  # every draw is the most probable word
        assert captions(got) == [most_probable] * 3
    assert got.scores[0].item() == pytest.approx(model_score_timed(most_probable), abs=1e-5)


def model_score_timed(words: list[str]) -> float:
    logp = torch.log_softmax(Timed(LOOP).table, -1)
    ids = [ID[w] for w in words] + [EOS_ID]
    return sum(float(logp[t, w]) for t, w in enumerate(ids))


def test_an_ordinary_temperature_divides_as_before():
    """The limit only replaces rows that would be NaN: at any ordinary temperature the weights
    are logits / T to the bit, so decodes are what they were."""
    x = (torch.randn(6, 50, generator=torch.Generator().manual_seed(3)) * 5).clamp(-3, 3)
    for t in (0.05, 0.7, 1.0, 3.0):
        assert torch.equal(tempered(x, t), x / t)
    x[2, 7] = 1e3  # the one row float32 loses at T 1e-38 (3 / 1e-38 it holds): 1e3 alone
    limit = tempered(x, 1e-38)
    assert torch.equal(limit[2] == 0, torch.arange(50) == 7) and limit[2].max() == 0
    assert torch.equal(limit[[0, 1, 3, 4, 5]], x[[0, 1, 3, 4, 5]] / 1e-38)
    assert not torch.isnan(torch.log_softmax(limit, 1)).any()


@pytest.mark.parametrize("p", [1e-46, 1e-300])
@pytest.mark.parametrize("method", ["sample", "gumbel"])
def test_a_top_p_below_float32s_smallest_number_keeps_the_most_probable_word(p, method):
    """p reads as 0 in float32, which every word reaches: the nucleus was empty (NaN weights,
    multinomial raised); it always holds the most probable word."""
    logp = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]))
    assert torch.isfinite(filtered(logp, 1.0, 0, p)).tolist() == \
        [[True, False, False, False], [False, False, False, True]]
    torch.manual_seed(0)
    model = markov(*[FLAT] * 2)
    drawn = captions(decode(model, context(model, 2), options(
        search="greedy", sample_method=method, top_p=p, n=20, max_len=1), VOCAB))
    assert drawn == [["dog"]] * 40


# short: "dog" (0.6); long: "a cat runs" (0.4 x 0.97^3): raw scores favour the short one
LENGTHS = {"<bos>": {"dog": 0.6, "a": 0.4}, "dog": {"<eos>": 1.0}, "a": {"cat": 0.97, "on": 0.03},
           "cat": {"runs": 0.97, "on": 0.03}, "runs": {"<eos>": 0.97, "on": 0.03},
           "on": {"<eos>": 1.0}}


def expected_by_formula(model, candidates, penalty: str) -> list[str]:
    """The caption the penalty's formula ranks first: S / ((5 + L)^a / 6^a) for wu_a, S / L for
    avg; L counts <eos>."""
    def ranked(words):
        s, length = model_score(model, words), len(words) + 1
        if penalty.startswith("wu_"):
            a = float(penalty[3:])
            return s / ((5 + length) ** a / 6 ** a)
        if penalty.startswith("avg_"):
            return s / length
        return s
    return max(candidates, key=ranked)


@pytest.mark.parametrize("penalty, winner", [("none", ["dog"]), ("wu_0", ["dog"]),
                                             ("wu_1", ["dog"]), ("wu_3", ["a", "cat", "runs"]),
                                             ("avg_0", ["a", "cat", "runs"])])
def test_length_penalties_pick_the_caption_their_formula_says(penalty, winner):
    model = markov(LENGTHS)
    candidates = [["dog"], ["a", "cat", "runs"]]
    assert expected_by_formula(model, candidates, penalty) == winner
    got = decode(model, context(model), options(beam_size=3, max_len=5, length_penalty=penalty,
                                                n=2), VOCAB)
    assert captions(got) == [winner, [c for c in candidates if c != winner][0]]
    scores = [model_score(model, c) for c in captions(got)]
    assert got.scores.tolist() == pytest.approx(scores, abs=1e-5)  # the model's, unpenalised


def test_length_penalty_formulas():
    s, length = torch.tensor([-2.0]), torch.tensor([4])
    assert length_penalized("wu", 0.5, s, length).item() == pytest.approx(-2 / (9 / 6) ** 0.5)
    assert length_penalized("avg", 0.7, s, length).item() == pytest.approx(-0.5)
    assert length_penalized("none", 0.0, s, length).item() == -2.0


def test_wu_alpha_is_bounded_where_float32_holds_the_penalty():
    """(5 + L)^alpha overflowed float32 from alpha 40 or so (every score 0 or NaN: empty or cut
    captions) and 6^alpha raised OverflowError at 1000; up to the bound, at the longest
    captions, every score is the formula's."""
    longest = MAX_CAPTION_WORDS + 1  # tokens, <eos> included
    s = torch.tensor([float("-inf"), -50.0, -3.0, -1e-3, 0.0])
    lengths = torch.tensor([longest, longest, 7, 1, longest])
    got = length_penalized("wu", MAX_WU_ALPHA, s, lengths)
    exact = [v / ((5 + n) / 6) ** MAX_WU_ALPHA for v, n in zip(s.tolist(), lengths.tolist())]
    assert got.tolist() == pytest.approx(exact, rel=1e-5)
    assert not torch.isnan(got).any()
    model = markov(LENGTHS)
    got = decode(model, context(model), options(beam_size=3, max_len=MAX_CAPTION_WORDS,
                                                length_penalty="wu_10"), VOCAB)
    assert captions(got) == [expected_by_formula(model, [["dog"], ["a", "cat", "runs"]],
                                                 "wu_10")]
    for above in ("wu_10.5", "wu_40", "wu_60", "wu_1000", "wu_1e400"):
        with pytest.raises(CapstackError, match=(
                rf"^capstack evaluate: eval.length_penalty: wu_ALPHA takes ALPHA from 0 to 10 "
                rf"\(GNMT's is within 0 to 1; above 10, \(5 \+ L\)\^ALPHA leaves float32\), "
                rf"got '{above}'$")):
            from_dict(EvalConfig, {"length_penalty": above}, "capstack evaluate", "eval.")
    assert options(length_penalty="avg_1000").length_penalty == "avg_1000"  # alpha unused


TWINS = {"<bos>": {"dog": 0.5, "cat": 0.45, "grass": 0.05}, "dog": {"<eos>": 1.0},
         "cat": {"<eos>": 1.0}, "grass": {"<eos>": 1.0}}


def test_diverse_beam_search_gives_differing_groups_where_lambda_0_gives_duplicates():
    model = markov(TWINS, TWINS)
    ctx = context(model, 2)
    same = captions(decode(model, ctx, options(search="diverse", beam_size=2, group_size=2,
                                               diversity_lambda=0.0, n=2), VOCAB))
    apart = captions(decode(model, ctx, options(search="diverse", beam_size=2, group_size=2,
                                                diversity_lambda=1.0, n=2), VOCAB))
    assert same == [["dog"], ["dog"]] * 2  # two groups of one beam: greedy twice
    assert apart == [["dog"], ["cat"]] * 2  # the second group pays 1 for "dog": log .5 - 1
    # groups of two beams, ranked: each group's best, then each group's second
    pairs = captions(decode(model, ctx, options(search="diverse", beam_size=4, group_size=2,
                                                diversity_lambda=0.0, n=4), VOCAB))
    assert pairs[:4] == [["dog"], ["dog"], ["cat"], ["cat"]]  # both groups {dog, cat}
    pairs = captions(decode(model, ctx, options(search="diverse", beam_size=4, group_size=2,
                                                diversity_lambda=5.0, n=4), VOCAB))
    # the second group pays 5 for dog and for cat: grass (log .05), then dog (log .5 - 5)
    assert pairs[:4] == [["dog"], ["grass"], ["cat"], ["dog"]]


def test_n_gives_the_beams_n_best_in_order_and_n_samples():
    model = Random(5)
    ctx = context(model, 2)
    best = decode(model, ctx, options(beam_size=4, max_len=5, n=3, remove_bad_endings=True,
                                      bad_endings=[]), VOCAB)
    assert best.tokens.shape[0] == 6
    assert torch.equal(best.tokens[0::3][:, :beam_search(model, ctx, 4, 5).tokens.shape[1]],
                       beam_search(model, ctx, 4, 5).tokens)  # rank 1 is the beam's best
    for image in range(2):
        s = best.scores[image * 3:image * 3 + 3]
        assert (s[:-1] >= s[1:]).all()
        assert len({tuple(t) for t in best.tokens[image * 3:image * 3 + 3].tolist()}) == 3
    torch.manual_seed(0)
    drawn = decode(model, ctx, options(search="greedy", sample_method="sample", n=4, max_len=5),
                   VOCAB)
    assert drawn.tokens.shape[0] == 8


# ------------------------------------------------------------------------- one beam search


def test_every_search_decodes_what_the_two_beam_searches_decoded_before_their_merge():
    """tests/data/beam_search_before_merge.json: captions and scores that the settling beam
    search (the defaults) and the general one (length penalties, diverse groups, blocking, n
    best, temperature) gave before they became one function, for random Markov decoders."""
    recorded = json.loads((Path(__file__).parent / "data" / "beam_search_before_merge.json")
                          .read_text())
    for case in recorded:
        model = Random(case["seed"], 4)
        got = decode(model, context(model, 4), DecodingConfig(**{"max_len": 8,
                                                                 **case["options"]}), VOCAB)
        assert got.tokens.tolist() == case["tokens"], case["options"]
        assert got.scores.tolist() == pytest.approx(case["scores"], rel=1e-6, abs=1e-6)


def test_the_beam_has_one_default_the_experiments_eval_block():
    """evaluate and caption both leave --beam to the experiment's eval.beam_size, and lay their
    options over eval: in one place."""
    from cli import main
    from trainer.evaluation.evaluate import eval_settings

    for name in ("evaluate", "caption"):
        beam = next(p for p in main.commands[name].params if p.name == "beam_size")
        assert beam.default is None, name
    saved = EvalConfig(beam_size=3)
    assert eval_settings(saved, {"max_len": 16}, "capstack caption").beam_size == 3
    assert eval_settings(saved, {"max_len": 16}, beam_size=7).beam_size == 7
    assert EvalConfig().beam_size == DecodingConfig().beam_size == 5
