"""The vectorised CIDEr-D equals pycocoevalcap's, on real-looking and odd captions."""

from __future__ import annotations

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider
from reward_fixtures import REFS, WORDS, token_ids

from pipeline.core.errors import CapstackError
from trainer.rewards.cider import CiderD


def reference_scores(candidates: dict[int, list[str]]) -> np.ndarray:
    _, scores = Cider().compute_score(REFS, {i: [" ".join(c)] for i, c in candidates.items()})
    return np.asarray(scores)


@pytest.mark.parametrize("candidates", [
    {10: "a red circle on the left".split(), 11: "a blue square".split(),
     12: "a red circle and a blue square".split(), 13: ["a"]},
    {10: [], 11: "square square square square square".split(), 12: ["<unk>"],
     13: "a a a a a a".split()},
    {10: ("a red circle on the left of a blue square and a small red circle on the right of the "
          "big blue square").split(), 11: "the".split(), 12: "blue square red circle".split(),
     13: "a a".split()},
])
def test_scores_equal_pycocoevalcap(candidates):
    scorer = CiderD.from_references(REFS, WORDS)
    ids = sorted(candidates)
    tokens, lengths = token_ids([candidates[i] for i in ids])
    np.testing.assert_allclose(scorer.score(ids, tokens, lengths), reference_scores(candidates),
                               atol=1e-6, rtol=0)


def test_random_captions_and_several_per_image():
    rng = np.random.default_rng(0)
    scorer = CiderD.from_references(REFS, WORDS)
    for _ in range(5):
        captions = {i: [WORDS[w] for w in rng.integers(3, len(WORDS), rng.integers(0, 20))]
                    for i in REFS}
        ids = sorted(captions)
        tokens, lengths = token_ids([captions[i] for i in ids])
        np.testing.assert_allclose(scorer.score(ids, tokens, lengths),
                                   reference_scores(captions), atol=1e-6, rtol=0)
    # five samples of image 10 scored in one call, as SCST does
    samples = [["a", "red", "circle"], [], ["a"] * 9, ["blue", "square"], ["a", "red", "circle"]]
    tokens, lengths = token_ids(samples)
    scores = scorer.score([10] * 5, tokens, lengths)
    singles = [reference_scores({**{i: ["a"] for i in REFS}, 10: s})[0] for s in samples]
    np.testing.assert_allclose(scores, singles, atol=1e-6, rtol=0)
    assert scores[0] == scores[4]


def test_cache_round_trip_and_errors(tmp_path):
    scorer = CiderD.from_references(REFS, WORDS)
    scorer.save(tmp_path / "cider.npz")
    loaded = CiderD.load(tmp_path / "cider.npz")
    tokens, lengths = token_ids([["a", "red", "circle"], ["blue", "square"]])
    np.testing.assert_array_equal(loaded.score([10, 11], tokens, lengths),
                                  scorer.score([10, 11], tokens, lengths))
    assert loaded.vocab_digest() == scorer.vocab_digest()
    with pytest.raises(CapstackError, match="image 99 has no cached references"):
        scorer.score([99], tokens[:1], lengths[:1])
    with pytest.raises(CapstackError, match="not found"):
        CiderD.load(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(CapstackError, match="not a CIDEr-D cache"):
        CiderD.load(tmp_path / "bad.npz")


def test_cache_stage_command_builds_from_the_prepared_split(tmp_path, capstack):
    from pipeline.captions.prepared import load_captions
    from trainer.scoring.references import load_references
    from trainer.scoring.text import simple_tokenize
    from trainer_fixtures import make_prepared

    _, prepared = make_prepared(tmp_path)
    out = tmp_path / "cider" / "train.npz"
    result = capstack("cider-cache", prepared, "--out", out)
    assert "12 images" in result.output
    scorer = CiderD.load(out)
    captions = load_captions(prepared)
    assert scorer.vocab_digest() == captions.vocab.digest()
    refs = load_references(prepared / "refs_train.json")
    image = sorted(refs)[0]
    words = simple_tokenize(refs[image][0]).split()
    ids = [captions.vocab.wtoi.get(w, 3) for w in words]
    score = scorer.score([image], np.array([ids]), np.array([len(ids)]))[0]
    tokenized = {i: [simple_tokenize(c) for c in cs] for i, cs in refs.items()}
    candidates = {i: [" ".join(captions.vocab.itow[t] for t in ids)] if i == image else ["a"]
                  for i in tokenized}
    _, expected = Cider().compute_score(tokenized, candidates)
    assert score == pytest.approx(expected[list(tokenized).index(image)], abs=1e-6)
