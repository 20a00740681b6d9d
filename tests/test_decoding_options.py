"""Evaluation-time decoding options (trainer/decoding_options.py): each changes decoding as it
should on small decoders whose next-word distributions are set by hand, the combinations that
cannot work are refused by name, and the defaults decode exactly as before."""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
from collections import Counter
from functools import partial
from pathlib import Path
from dataclasses import asdict

import pytest
import torch
import yaml
from click.testing import CliRunner

from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID, Vocabulary
from pipeline.core.errors import CapstackError
from trainer.batch import EvalBatch
from trainer.config import EvalConfig, from_dict, load_experiment
from trainer.bounds import MAX_CAPTION_WORDS
from trainer.decoding import beam_search, greedy, tempered
from trainer.decoders.base import Decoder, per_row
from trainer.decoding import BAD_ENDINGS, Beam, DecodingConfig, decode, filtered
from trainer.decoding.rules import MAX_WU_ALPHA, length_penalized
from trainer.evaluation.predict import predict
from trainer.scoring.references import load_results

WORDS = ["a", "dog", "cat", "runs", "the", "on", "grass"]
VOCAB = Vocabulary(WORDS)
ID = VOCAB.wtoi  # word -> id
V = len(VOCAB)
TINY = -30.0  # the logit of a word a hand-built decoder all but forbids


class Markov(Decoder):
    """Next-word logits set by hand per (image, previous word): ``table`` [images, V, V]."""

    has_attention = False

    def __init__(self, table: torch.Tensor):
        super().__init__(None, table.shape[-1], 1)
        self.table = table

    def encode(self, feats, mask):
        return {"image": feats[:, 0, 0].long()}

    def init_state(self, ctx, rows):
        return (per_row(ctx["image"], rows),)

    def step(self, words, state, ctx):
        return self.table[state[0], words], state, None


def markov(*images: dict) -> Markov:
    """One image per mapping {previous word: {next word: probability}}; words not named get
    TINY logits, previous words not named go to <eos>."""
    table = torch.full((len(images), V, V), TINY)
    for i, rules in enumerate(images):
        table[i, :, EOS_ID] = 0.0
        for prev, nexts in rules.items():
            row = table[i, BOS_ID if prev == "<bos>" else ID[prev]]
            row[:] = TINY
            for word, p in nexts.items():
                row[EOS_ID if word == "<eos>" else ID[word]] = math.log(p)
    return Markov(table)


class Timed(Decoder):
    """Next-word logits set by hand per step t alone: ``table`` [T, V] (<eos> after T steps)."""

    has_attention = False

    def __init__(self, steps: list[dict]):
        super().__init__(None, V, 1)
        self.table = torch.full((len(steps) + 1, V), TINY)
        self.table[len(steps), EOS_ID] = 0.0
        for t, nexts in enumerate(steps):
            for word, p in nexts.items():
                self.table[t, EOS_ID if word == "<eos>" else ID[word]] = math.log(p)

    def encode(self, feats, mask):
        return {"image": feats[:, 0, 0]}

    def init_state(self, ctx, rows):
        return (torch.zeros(rows, dtype=torch.long),)

    def step(self, words, state, ctx):
        t = state[0].clamp(max=self.table.shape[0] - 1)
        return self.table[t], (state[0] + 1,), None


def trimmed(tokens: torch.Tensor) -> torch.Tensor:
    """Without the columns of <pad> alone at the end."""
    keep = int((tokens != PAD_ID).any(0).nonzero().max()) + 1
    return tokens[:, :keep]


def context(model: Decoder, images: int = 1):
    feats = torch.arange(images, dtype=torch.float32)[:, None, None]
    return model.encode(feats, torch.ones(images, 1, dtype=torch.bool))


def captions(decoded) -> list[list[str]]:
    return [VOCAB.decode(row) for row in decoded.tokens.tolist()]


def options(**given) -> DecodingConfig:
    return from_dict(DecodingConfig, given, "test", "eval.")


def model_score(model: Markov, words: list[str], image: int = 0) -> float:
    """The model's log-probability of a caption, <eos> included."""
    logp = torch.log_softmax(model.table[image], -1)
    ids = [ID[w] for w in words] + [EOS_ID]
    return sum(float(logp[prev, w]) for prev, w in zip([BOS_ID] + ids[:-1], ids))


class Random(Markov):
    def __init__(self, seed: int, images: int = 3):
        g = torch.Generator().manual_seed(seed)
        super().__init__(torch.randn(images, V, V, generator=g) * 2)


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


# ------------------------------------------------------------------------- progress, Ctrl-C


def batches(images: int, per_batch: int = 2) -> list[EvalBatch]:
    return [EvalBatch(list(range(start, min(start + per_batch, images))),
                      torch.arange(start, min(start + per_batch, images), dtype=torch.float32)
                      [:, None, None], torch.ones(min(per_batch, images - start), 1,
                                                  dtype=torch.bool), None)
            for start in range(0, images, per_batch)]


class Signalled(Markov):
    """Random(0)'s table; sends itself ``signum`` at its ``at``-th step and counts the steps
    run after it (a decode honouring the signal at once runs none)."""

    def __init__(self, signum: int, at: int):
        super().__init__(Random(0, images=6).table)
        self.signum, self.at, self.steps, self.after = signum, at, 0, 0

    def step(self, words, state, ctx):
        self.steps += 1
        if self.steps == self.at:
            os.kill(os.getpid(), self.signum)
        elif self.steps > self.at:
            self.after += 1
        return super().step(words, state, ctx)


@pytest.fixture
def default_sigint():
    """Python's own Ctrl-C handler (KeyboardInterrupt), whatever the test runner set."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("how", [dict(beam_size=3), dict(beam_size=3, block_trigrams=True),
                                 dict(search="greedy", sample_method="sample", n=2)])
def test_a_ctrl_c_ends_a_commands_decode_at_once_in_one_line(default_sigint, how):
    """Batches of 2 images; the Ctrl-C comes while the second batch decodes."""
    config = options(max_len=20, **how)
    torch.manual_seed(0)
    first = Signalled(signal.SIGINT, at=10 ** 6)  # never: how many steps the first batch takes
    predict(first, VOCAB, batches(2), torch.device("cpu"), config)
    torch.manual_seed(0)
    model = Signalled(signal.SIGINT, at=first.steps + 2)
    with pytest.raises(CapstackError, match=r"^interrupted \(Ctrl-C\) while decoding, after 2 "
                                            r"of 6 images: nothing written$"):
        predict(model, VOCAB, batches(6), torch.device("cpu"), config, progress=6)
    assert model.after == 0
    # a decode that is no command's (a training's validation) is interrupted as it was
    model = Signalled(signal.SIGINT, at=3)
    with pytest.raises(KeyboardInterrupt):
        predict(model, VOCAB, batches(6), torch.device("cpu"), config)
    assert model.after == 0


def test_sigterm_passes_through_a_commands_decode_at_once():
    from cli import Terminated, stop_on_sigterm

    before = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        model = Signalled(signal.SIGTERM, at=4)
        with pytest.raises(Terminated, match="stopped by SIGTERM"):
            predict(model, VOCAB, batches(6), torch.device("cpu"), options(beam_size=3), progress=6)
        assert model.after == 0
    finally:
        signal.signal(signal.SIGTERM, before)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_commands_decode_shows_a_progress_bar_over_the_images_on_a_terminal(monkeypatch):
    import trainer.evaluation.predict as predicting

    monkeypatch.setattr(predicting, "tqdm", partial(predicting.tqdm, mininterval=0))
    model, config = Random(0, images=6), options(beam_size=3)
    for stderr, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr("sys.stderr", stderr)
        preds = predict(model, VOCAB, batches(6), torch.device("cpu"), config,
                        progress=6)
        assert [p.image_id for p in preds] == list(range(6))
        bar = stderr.getvalue()
        assert all(f"decode: {percent:>3}%" in bar and f"| {n}/6 [" in bar
                   for n, percent in ((0, 0), (2, 33), (4, 67), (6, 100))) == shown
        assert (bar == "") == (not shown)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    predict(model, VOCAB, batches(6), torch.device("cpu"), config)  # no command's
    assert terminal.getvalue() == ""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from trainer.train import train
    from trainer_fixtures import prepared_with_grid, write_experiment

    root = tmp_path_factory.mktemp("decoding")
    prepared, grid = prepared_with_grid(root)
    experiment = write_experiment(root / "exp.yaml", decoder="show_tell", captions=prepared,
                                  features=[grid], epochs=1)
    train(load_experiment(experiment), root / "run", progress=False)
    return root / "run"


@pytest.mark.slow
def test_evaluate_writes_every_caption_with_its_rank_and_scores_the_first(checkpoint, tmp_path):
    from trainer.evaluation.evaluate import evaluate_checkpoint

    one = evaluate_checkpoint(checkpoint, tmp_path / "one", figures=0, spice=False)
    results_one = json.loads((tmp_path / "one" / "results_test.json").read_text())
    assert all(set(r) == {"image_id", "caption"} for r in results_one)
    assert one["setting"]["decoding"] == ""
    three = evaluate_checkpoint(checkpoint, tmp_path / "three", figures=0, spice=False,
                                decoding={"beam_size": 3, "n": 3})
    results = json.loads((tmp_path / "three" / "results_test.json").read_text())
    assert [r["rank"] for r in results] == [1, 2, 3] * len(results_one)
    firsts = [r for r in results if r["rank"] == 1]
    beam3 = evaluate_checkpoint(checkpoint, tmp_path / "beam3", figures=0, spice=False,
                                beam_size=3)
    assert firsts == [{**r, "rank": 1} for r in json.loads(
        (tmp_path / "beam3" / "results_test.json").read_text())]
    assert three["metrics"] == beam3["metrics"]  # rank 1 is what is scored
    assert three["n"] == 3 and three["setting"]["decoding"] == "n=3"
    whole = evaluate_checkpoint(checkpoint, tmp_path / "whole", figures=0, spice=False,
                                decoding=DecodingConfig(beam_size=2, block_trigrams=True))
    assert whole["beam_size"] == 2 and whole["block_trigrams"]
    with pytest.raises(CapstackError, match="capstack evaluate: eval.top_p: the nucleus"):
        evaluate_checkpoint(checkpoint, tmp_path / "no", decoding={"top_p": 0.9})
    assert asdict(DecodingConfig()).keys() <= one.keys()


@pytest.mark.slow
@pytest.mark.parametrize("signum, exit_code, message", [
    (signal.SIGINT, 1, r"Error: interrupted \(Ctrl-C\) while decoding, after 0 of \d+ images: "
                       r"nothing written"),
    (signal.SIGTERM, 143, r"Error: stopped by SIGTERM: ")])
def test_evaluate_stopped_while_decoding_ends_at_once_writing_nothing(
        checkpoint, tmp_path, monkeypatch, default_sigint, signum, exit_code, message):
    """The widest, longest decode the bounds allow, stopped at its third step."""
    import trainer.evaluation.predict as predicting
    from cli import main

    steps = []

    def signalling(model, ctx, config, vocab=None):
        step = model.step

        def counted(*args):
            steps.append(len(steps))
            if len(steps) == 3:
                os.kill(os.getpid(), signum)
            return step(*args)

        monkeypatch.setattr(model, "step", counted)
        return decode(model, ctx, config, vocab)

    monkeypatch.setattr(predicting, "decode", signalling)
    before = signal.getsignal(signal.SIGTERM)
    try:
        out = CliRunner().invoke(main, ["evaluate", str(checkpoint), "--out", str(tmp_path / "e"),
                                        "--beam", "100", "--max-len", str(MAX_CAPTION_WORDS),
                                        "--block-trigrams", "--figures", "0"])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert out.exit_code == exit_code, out.output
    assert len(steps) == 3  # not one step more
    assert len(out.output.strip().splitlines()) == 1
    assert re.match(message, out.output.strip()), out.output
    assert not (tmp_path / "e").exists()


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
