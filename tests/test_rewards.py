"""Rewards by name: each equals its pycocoevalcap reference, the mix its weighted sum, the old
``objective.cider_cache`` still reads, and SCST steps on a BLEU reward and on a mix."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch
import yaml
from pycocoevalcap.bleu.bleu import Bleu as CocoBleu
from pycocoevalcap.rouge.rouge import Rouge as CocoRouge
from reward_fixtures import REFS as CAPTION_REFS
from reward_fixtures import WORDS, token_ids

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from trainer.config import component_from_dict, load_experiment
from trainer.rewards import REWARDS, build_reward
from trainer.rewards.base import Reward, tokenized_references
from trainer.rewards.bleu import Bleu, BleuConfig
from trainer.rewards.cider import CiderD, CiderDConfig
from trainer.rewards.cider_cache import build_cache
from trainer.rewards.rouge import RougeL, RougeLConfig
from trainer.train import train
from trainer_fixtures import make_prepared, write_experiment, write_feature_store

REFS = {**CAPTION_REFS,
        14: ["", "small"]}  # an empty reference: ROUGE-L's split(" ") makes it one empty word
CANDIDATES = [  # (image, words): exact, partial, empty, repeated, unknown, over-long
    (10, "a red circle on the left"), (10, ""), (10, "a a a a a a a a a"), (10, "circle red a"),
    (11, "a blue square"), (11, "square square square square square"), (11, "<unk>"),
    (12, "a red circle and a blue square"), (12, "blue square red circle"), (12, "the"),
    (13, "a"), (13, "a a"), (13, ""), (14, ""), (14, "small"), (14, "big small"),
    (10, " ".join(["a red circle on the left of a blue square and"] * 8)),  # 80 words
]


def batch(candidates=CANDIDATES):
    """image ids [B], token ids [B, T] as SCST passes them (zeros after the words), lengths."""
    tokens, lengths = token_ids([words.split() for _, words in candidates])
    return [image for image, _ in candidates], tokens, lengths


def coco(scorer, candidates=CANDIDATES, refs=REFS):
    """pycocoevalcap's per-image scores, one entry per candidate (images may repeat)."""
    gts = {k: refs[image] for k, (image, _) in enumerate(candidates)}
    res = {k: [words] for k, (_, words) in enumerate(candidates)}
    return scorer.compute_score(gts, res)[1]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_bleu_is_pycocoevalcaps_per_image_bleu(n):
    """Bleu(4).compute_score returns per order a list of per-image scores (closest reference
    length, its 1e-15 / 1e-9 smoothing and brevity penalty): BLEU-n is that list's n-th."""
    reward = Bleu.from_references(BleuConfig(n=n), REFS, WORDS)
    expected = np.asarray(coco(CocoBleu(4))[n - 1])
    np.testing.assert_allclose(reward.score(*batch()), expected, atol=1e-9, rtol=0)


def test_rouge_l_is_pycocoevalcaps_per_image_rouge_l():
    reward = RougeL.from_references(RougeLConfig(), REFS, WORDS)
    expected = np.asarray(coco(CocoRouge()))
    np.testing.assert_allclose(reward.score(*batch()), expected, atol=1e-9, rtol=0)
    assert expected[CANDIDATES.index((14, ""))] > 0  # the empty word's match, kept


def test_random_captions_equal_their_references():
    rng = np.random.default_rng(0)
    bleu = Bleu.from_references(BleuConfig(n=4), REFS, WORDS)
    rouge = RougeL.from_references(RougeLConfig(), REFS, WORDS)
    for _ in range(5):
        candidates = [(image, " ".join(WORDS[w] for w in rng.integers(3, len(WORDS),
                                                                     rng.integers(0, 20))))
                      for image in rng.choice(sorted(REFS), 30)]
        np.testing.assert_allclose(bleu.score(*batch(candidates)),
                                   coco(CocoBleu(4), candidates)[3], atol=1e-9, rtol=0)
        np.testing.assert_allclose(rouge.score(*batch(candidates)),
                                   coco(CocoRouge(), candidates), atol=1e-9, rtol=0)


def test_an_image_without_references_is_named():
    reward = Bleu.from_references(BleuConfig(), REFS, WORDS)
    with pytest.raises(CapstackError, match="BLEU: image 99 has no references"):
        reward.score([99], np.array([[4]]), np.array([1]))


# -- on a prepared folder, as an objective builds them -----------------------------------------

@pytest.fixture(scope="module")
def prepared(data, tmp_path_factory):
    """(this module's folder, the session's prepared folder): the module writes under the first
    (its CIDEr-D cache, stores, runs), never into the second."""
    root = tmp_path_factory.mktemp("rewards")
    folder = data.prepared
    build_cache(folder, "train", root / "cider.npz")
    return root, folder


def sampled(captions, rng, count=24):
    """Random captions of train images, as token ids of the prepared vocabulary."""
    images = captions.image_ids[captions.rows("train")]
    ids = rng.choice(images, count)
    lengths = rng.integers(0, 12, count)
    tokens = rng.integers(4, len(captions.vocab), (count, 12)) * (
        np.arange(12)[None, :] < lengths[:, None])
    return ids, tokens, lengths


def built(mapping: dict, captions):
    spec = component_from_dict(REWARDS, mapping, "test", "reward")
    return build_reward(spec.name, spec.config, captions)


def test_references_are_the_train_split_tokenized_as_the_cider_cache(prepared):
    root, folder = prepared
    captions = load_captions(folder)
    rng = np.random.default_rng(1)
    ids, tokens, lengths = sampled(captions, rng)
    refs = tokenized_references(captions)
    words = [(int(i), " ".join(captions.vocab.itow[t] for t in row[:n]))
             for i, row, n in zip(ids, tokens, lengths)]
    bleu = built({"name": "bleu", "n": 4}, captions)
    np.testing.assert_allclose(bleu.score(ids, tokens, lengths),
                               coco(CocoBleu(4), words, refs)[3], atol=1e-9, rtol=0)
    rouge = built({"name": "rouge-l"}, captions)
    np.testing.assert_allclose(rouge.score(ids, tokens, lengths), coco(CocoRouge(), words, refs),
                               atol=1e-9, rtol=0)
    cider = built({"name": "cider-d", "cache": str(root / "cider.npz")}, captions)
    np.testing.assert_array_equal(cider.score(ids, tokens, lengths),  # today's scorer, unchanged
                                  CiderD.load(root / "cider.npz").score(ids, tokens, lengths))


def test_the_mix_is_the_weighted_sum_of_its_parts(prepared):
    root, folder = prepared
    captions = load_captions(folder)
    ids, tokens, lengths = sampled(captions, np.random.default_rng(2))
    cache = str(root / "cider.npz")
    mix = built({"name": "mix", "parts": [{"name": "cider-d", "cache": cache, "weight": 1},
                                          {"name": "bleu", "n": 4, "weight": 0.5}]}, captions)
    cider = built({"name": "cider-d", "cache": cache}, captions).score(ids, tokens, lengths)
    bleu = built({"name": "bleu", "n": 4}, captions).score(ids, tokens, lengths)
    np.testing.assert_allclose(mix.score(ids, tokens, lengths), 1.0 * cider + 0.5 * bleu,
                               atol=1e-12, rtol=0)
    assert (bleu > 0).any() and (cider > 0).any()
    total, parts = mix.score_parts(ids, tokens, lengths)  # each part before its weight
    np.testing.assert_array_equal(total, mix.score(ids, tokens, lengths))
    assert list(parts) == ["cider-d", "bleu"]
    np.testing.assert_array_equal(parts["cider-d"], cider)
    np.testing.assert_array_equal(parts["bleu"], bleu)
    assert built({"name": "bleu"}, captions).score_parts(ids, tokens, lengths)[1] == {}
    twice = built({"name": "mix", "parts": [{"name": "bleu", "n": 1, "weight": 1},
                                            {"name": "bleu", "n": 4, "weight": 0}]}, captions)
    total, parts = twice.score_parts(ids, tokens, lengths)  # a repeated name: its place
    assert list(parts) == ["bleu_1", "bleu_2"]
    np.testing.assert_array_equal(parts["bleu_2"], bleu)
    np.testing.assert_array_equal(total, parts["bleu_1"])


def test_the_cider_d_reward_keeps_its_checks(prepared, tmp_path):
    _, folder = prepared
    _, other = make_prepared(tmp_path, seed=9, n_train=5)
    build_cache(other, "train", tmp_path / "other.npz")
    with pytest.raises(CapstackError, match="another vocabulary"):
        built({"name": "cider-d", "cache": str(tmp_path / "other.npz")}, load_captions(folder))


@pytest.mark.slow  # two Java scorers start (seconds each)
@pytest.mark.skipif(shutil.which("java") is None, reason="METEOR runs on java")
def test_meteor_is_pycocoevalcaps_meteor_in_one_kept_process(prepared):
    from pycocoevalcap.meteor.meteor import Meteor as CocoMeteor

    _, folder = prepared
    captions = load_captions(folder)
    ids, tokens, lengths = sampled(captions, np.random.default_rng(3), count=8)
    meteor = built({"name": "meteor"}, captions)
    process = meteor.scorer.meteor_p
    try:
        first = meteor.score(ids, tokens, lengths)
        again = meteor.score(ids[:3], tokens[:3], lengths[:3])
        assert meteor.scorer.meteor_p is process and process.poll() is None  # kept alive
    finally:
        meteor.close()
    refs = tokenized_references(captions)
    words = [(int(i), " ".join(captions.vocab.itow[t] for t in row[:n]))
             for i, row, n in zip(ids, tokens, lengths)]
    reference = CocoMeteor()
    try:
        expected = np.asarray(coco(reference, words, refs))
    finally:
        reference.meteor_p.stdin.close()
        reference.meteor_p.kill()
        reference.meteor_p.wait()
    np.testing.assert_array_equal(first, expected)  # the scorer's printed numbers, as printed
    np.testing.assert_array_equal(again, expected[:3])


def test_meteor_without_java_is_refused_naming_java(prepared, monkeypatch):
    import trainer.rewards.meteor as meteor

    monkeypatch.setattr(meteor.shutil, "which", lambda name: None)
    with pytest.raises(CapstackError, match="java not found"):
        built({"name": "meteor"}, load_captions(prepared[1]))


# -- the experiment file ----------------------------------------------------------------------

def experiment(tmp_path, objective=None):
    return write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=tmp_path / "p",
                            features=[tmp_path / "grid.lmdb"], objective=objective)


def test_an_unknown_reward_is_refused_with_the_registered_names(tmp_path):
    path = experiment(tmp_path, {"name": "scst", "reward": {"name": "bleurt"}})
    with pytest.raises(CapstackError) as error:
        load_experiment(path)
    assert str(error.value) == (f"{path}: objective.reward.name: unknown reward 'bleurt' "
                                f"(choose {', '.join(REWARDS)})")
    mixed = experiment(tmp_path, {"name": "scst", "reward": {"name": "mix", "parts": [
        {"name": "bleu", "weight": 1}, {"name": "bleurt", "weight": 1}]}})
    with pytest.raises(CapstackError, match=r"objective.reward.parts\[1\].name: unknown reward"):
        load_experiment(mixed)


def test_rewards_read_nested_and_write_back_as_read(tmp_path):
    mix = {"name": "mix", "parts": [{"name": "cider-d", "cache": "c.npz", "weight": 1.0},
                                    {"name": "bleu", "n": 4, "weight": 0.5}]}
    config = load_experiment(experiment(tmp_path, {"name": "scst", "reward": mix}))
    assert config.to_dict()["objective"]["reward"] == mix
    part = config.objective.config.reward.config.parts[1]
    assert (part.name, part.config.n, part.beside.weight) == ("bleu", 4, 0.5)
    with pytest.raises(CapstackError, match=r"parts\[0\].weight: must be a finite number, 0 or"):
        load_experiment(experiment(tmp_path, {"name": "scst", "reward": {
            "name": "mix", "parts": [{"name": "bleu", "weight": -1}]}}))
    with pytest.raises(CapstackError, match=r"objective.reward.n: must be from 1 to 4, got 5"):
        load_experiment(experiment(tmp_path, {"name": "scst", "reward": {"name": "bleu", "n": 5}}))
    # --set A.B.name=OTHER starts the nested component afresh, the same name keeps it
    path = experiment(tmp_path, {"name": "scst", "reward": {"name": "cider-d", "cache": "c.npz"}})
    assert load_experiment(path, ["objective.reward.name=bleu"]).objective.config.reward.config \
        == BleuConfig(n=4)
    assert load_experiment(path, ["objective.reward.name=cider-d"]).objective.config.reward \
        .config == CiderDConfig("c.npz")


def test_an_old_experiment_with_cider_cache_reads_with_a_warning_naming_the_new_key(tmp_path):
    path = experiment(tmp_path, {"name": "scst", "cider_cache": "data/cider/train.npz",
                                 "samples": 3})
    with pytest.warns(FutureWarning, match=r"objective.cider_cache is objective.reward: "
                                           r"\{name: cider-d, cache: FILE\} now"):
        config = load_experiment(path)
    reward = config.objective.config.reward
    assert (reward.name, reward.config, config.objective.config.samples) == (
        "cider-d", CiderDConfig("data/cider/train.npz"), 3)
    assert config.to_dict()["objective"]["reward"] == {"name": "cider-d",
                                                      "cache": "data/cider/train.npz"}
    # a stages file's --set, onto any objective
    plain = experiment(tmp_path)
    with pytest.warns(FutureWarning, match="objective.reward"):
        config = load_experiment(plain, ["objective.name=scst", "objective.cider_cache=c.npz"])
    assert config.objective.config.reward.config == CiderDConfig("c.npz")
    both = experiment(tmp_path, {"name": "scst", "cider_cache": "a.npz",
                                 "reward": {"name": "bleu"}})
    with warnings.catch_warnings(), pytest.raises(CapstackError, match="drop cider_cache"):
        warnings.simplefilter("ignore", FutureWarning)
        load_experiment(both)


# -- SCST on other rewards, and a checkpoint of the old key -------------------------------------

@pytest.fixture(scope="module")
def xe_run(prepared):
    root, folder = prepared
    store = write_feature_store(root / "grid.lmdb", load_captions(folder).image_ids)
    exp = write_experiment(root / "xe.yaml", decoder="show_tell", captions=folder,
                           features=[store], epochs=1)
    train(load_experiment(exp), root / "xe", progress=False)
    return root, exp


@pytest.mark.parametrize("reward", [
    "{name: bleu, n: 4}",
    "{name: mix, parts: [{name: cider-d, cache: CACHE, weight: 1}, {name: bleu, weight: 0.5}]}",
])
def test_an_scst_step_runs_on_another_reward(xe_run, tmp_path, reward, monkeypatch):
    """... and the run lets go of its reward (of each part of a mix) when it ends."""
    root, exp = xe_run
    reward = reward.replace("CACHE", str(root / "cider.npz"))
    closed = []
    monkeypatch.setattr(Reward, "close", lambda self: closed.append(type(self).__name__))
    config = load_experiment(exp, ["objective.name=scst", f"objective.reward={reward}",
                                   f"train.init_from={root / 'xe' / 'best.pt'}",
                                   "objective.samples=2", "train.lr=5e-5", "train.epochs=1"])
    train(config, tmp_path / "rl", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "train"]
    assert steps and all(np.isfinite(x["reward"]) and "time_reward" in x for x in steps)
    assert any(x["reward"] > 0 for x in steps)
    if "mix" in reward:  # each part's mean, the samples' and the greedy decodes', logged
        for x in steps:
            assert x["reward"] == pytest.approx(x["reward_cider-d"] + 0.5 * x["reward_bleu"])
            assert x["baseline"] == pytest.approx(x["baseline_cider-d"] + 0.5 * x["baseline_bleu"])
    else:
        assert not any(key.startswith("reward_") for x in steps for key in x)
    assert closed == (["Bleu"] if "mix" not in reward else ["CiderDReward", "Bleu"])


def test_a_checkpoint_saved_with_cider_cache_evaluates_and_resumes(xe_run, tmp_path):
    """A run whose checkpoints carry ``objective.cider_cache`` (saved before rewards were
    components) evaluates, and resumes under today's experiment: same recipe."""
    from trainer.checkpoint import load_checkpoint, save_checkpoint
    from trainer.evaluation.evaluate import load_model

    root, exp = xe_run
    cache = str(root / "cider.npz")
    rl = ["objective.name=scst", f"train.init_from={root / 'xe' / 'best.pt'}",
          "objective.samples=2", "train.lr=5e-5"]
    train(load_experiment(exp, rl + [f"objective.reward={{name: cider-d, cache: {cache}}}",
                                     "train.epochs=1"]), tmp_path / "rl", progress=False)
    for name in ("best.pt", "last.pt"):  # as a capstack before this change saved them
        ckpt = torch.load(tmp_path / "rl" / name, weights_only=True)
        objective = ckpt["experiment"]["objective"]
        objective["cider_cache"] = objective.pop("reward")["cache"]
        save_checkpoint(tmp_path / "rl" / name, ckpt)
    assert "cider_cache" in torch.load(tmp_path / "rl" / "last.pt",
                                       weights_only=True)["experiment"]["objective"]
    with pytest.warns(FutureWarning, match="objective.reward"):
        loaded = load_checkpoint(tmp_path / "rl" / "best.pt")
    assert loaded["experiment"]["objective"]["reward"] == {"name": "cider-d", "cache": cache}
    _, _, config = load_model(loaded)
    assert config.objective.config.reward.config == CiderDConfig(cache)
    resumed = train(load_experiment(exp, rl + [f"objective.cider_cache={cache}",
                                               "train.epochs=2"]),
                    tmp_path / "rl", progress=False)
    assert resumed.resumed_at == (1, 0) and resumed.epochs == 2
    saved = yaml.safe_load(json.dumps(load_checkpoint(tmp_path / "rl" / "last.pt")["experiment"]))
    assert saved["objective"]["reward"] == {"name": "cider-d", "cache": cache}


def test_rewards_command_lists_every_registered_reward_with_what_it_is():
    from click.testing import CliRunner

    from cli import main
    from trainer.rewards import REWARDS

    result = CliRunner().invoke(main, ["rewards"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert [line.split()[0] for line in lines] == sorted(REWARDS)
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # each says what it is
