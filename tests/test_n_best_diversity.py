"""The n-best diversity figures (trainer/scoring/n_best_diversity.py) on hand-made captions,
every value derived by hand in the comments."""

from __future__ import annotations

import math

import pytest

from trainer.scoring.n_best_diversity import (mean_mutual_bleu, mutual_bleu, n_best_diversity,
                                              per_image_distinct)


def split(*captions: str) -> list[list[str]]:
    return [c.split() for c in captions]


# image 1: two different captions; image 2: the same caption twice
TWO_IMAGES = {1: split("a dog", "a cat"), 2: split("a dog", "a dog")}


def test_distinct_within_each_image_then_averaged():
    # image 1: unigrams a dog a cat, 3 distinct of 4 = 0.75; bigrams (a dog)(a cat) 2 of 2 = 1
    # image 2: unigrams a dog a dog, 2 of 4 = 0.5; bigrams (a dog)(a dog) 1 of 2 = 0.5
    assert per_image_distinct(TWO_IMAGES, 1) == pytest.approx((0.75 + 0.5) / 2)
    assert per_image_distinct(TWO_IMAGES, 2) == pytest.approx((1.0 + 0.5) / 2)
    # an image without a bigram is left out of the mean, not counted as 0
    assert per_image_distinct({1: split("a", "b"), 2: split("a b", "a c")}, 2) == 1.0
    assert per_image_distinct({1: split("a", "b")}, 2) is None


def test_the_pooled_figures_read_every_caption_of_every_image():
    figures = n_best_diversity(TWO_IMAGES)
    # 4 captions, 8 words: a dog a cat a dog a dog; distinct words a, dog, cat
    assert figures["distinct-1"] == pytest.approx(3 / 8)
    # bigrams (a dog)(a cat)(a dog)(a dog): 2 distinct of 4
    assert figures["distinct-2"] == pytest.approx(2 / 4)
    assert figures["vocab_used"] == 3
    # distinct captions "a dog", "a cat" of 4 captions
    assert figures["unique_captions"] == pytest.approx(2 / 4)
    assert figures["mean_length"] == pytest.approx(2.0)
    assert figures["captions"] == 4 and figures["n"] == 2
    assert figures["distinct-1 per image"] == pytest.approx(0.625)
    assert figures["distinct-2 per image"] == pytest.approx(0.75)


def test_mutual_bleu_of_one_differing_word():
    # "a b c d e" against "a b c d f" (and back): matched 1-grams 4/5, 2-grams 3/4, 3-grams 2/3,
    # 4-grams 1/2, the same length (no brevity penalty): BLEU-4 = (4/5 3/4 2/3 1/2)^(1/4)
    # = (1/5)^(1/4)
    expected = 0.2 ** 0.25
    assert mutual_bleu(split("a b c d e", "a b c d f")) == pytest.approx([expected] * 2)


def test_mutual_bleu_is_1_for_alike_captions_and_near_0_for_disjoint_ones():
    assert mutual_bleu(split("a b c d", "a b c d", "a b c d")) == pytest.approx([1.0] * 3)
    # no word shared: every precision is pycocoevalcap's 1e-15 / count, BLEU-4 about 1e-15
    assert mutual_bleu(split("a b c d", "e f g h")) == pytest.approx([0.0, 0.0], abs=1e-12)
    assert mutual_bleu(split("a b c d")) == []  # one caption: no other to compare with


def test_mutual_bleu_takes_the_other_captions_as_references():
    # "a b c d" against {"a b c d x", "a b c y"}: every n-gram of it is in "a b c d x", so each
    # precision is 1; its length 4 has the closest reference length 4 ("a b c y"): BLEU-4 = 1
    assert mutual_bleu(split("a b c d", "a b c d x", "a b c y"))[0] == pytest.approx(1.0)


def test_m_bleu_averages_captions_then_images():
    by_image = {1: split("a b c d e", "a b c d f"), 2: split("a b c d", "a b c d"),
                3: split("lonely")}  # one caption: no mutual BLEU, left out
    assert mean_mutual_bleu(by_image) == pytest.approx((0.2 ** 0.25 + 1.0) / 2)
    assert n_best_diversity(by_image)["mBLEU-4"] == pytest.approx((0.2 ** 0.25 + 1.0) / 2)
    assert mean_mutual_bleu({1: split("only one")}) is None


def test_no_captions_give_no_made_up_figures():
    figures = n_best_diversity({})
    assert figures["n"] == 0 and figures["captions"] == 0
    assert figures["mBLEU-4"] is None and figures["distinct-1 per image"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in figures.values())
