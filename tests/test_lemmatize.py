"""``capstack prepare --lemmatize`` (HACap's captions): simplemma, word by word, recorded with its
version, which the prepared folder's checksums and the stage engine's code version follow."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from conftest import karpathy_image
from pipeline.captions.lemmatizers import build_lemmatizer
from pipeline.captions.prepare import prepare_captions
from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.engine.codeversion import code_distributions

pytest.importorskip("simplemma")
REPO = Path(__file__).resolve().parent.parent
SIMPLEMMA = importlib.metadata.version("simplemma")


@pytest.fixture
def shapes_json(tmp_path) -> Path:
    write_shapes_dataset(tmp_path / "shapes", n_train=40, n_val=5, n_test=5, seed=0, size=32)
    return tmp_path / "shapes" / "dataset_shapes.json"


@pytest.fixture
def inflected_json(tmp_path) -> Path:
    """Plurals and verb forms beside their lemmas, an unknown word, a special token's spelling."""
    images = [
        karpathy_image(0, "train", ["two dogs are running", "a dog runs on grass"]),
        karpathy_image(1, "train", ["men sit", "a man is sitting near zorked dogs"]),
        karpathy_image(2, "val", ["a dog <eos> barks", "dogs"]),
        karpathy_image(3, "test", ["the men ran", "a man"]),
    ]
    path = tmp_path / "dataset_inflected.json"
    path.write_text(json.dumps({"dataset": "inflected", "images": images}))
    return path


def fake_version(monkeypatch, version: str) -> None:
    """importlib.metadata.version (what prepare and the engine read) says ``version`` for
    simplemma."""
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: version if name == "simplemma" else real(name))


def read(folder: Path):
    vocab = json.loads((folder / "vocab.json").read_text())["itow"]
    with h5py.File(folder / "captions.h5", "r") as f:
        return vocab, f["labels"][()], dict(f.attrs)


def test_lemmatised_prepare_is_deterministic(shapes_json, tmp_path):
    for out in ("a", "b"):
        prepare_captions(shapes_json, tmp_path / out, min_count=2, lemmatizer="simplemma")
    (vocab_a, labels_a, _), (vocab_b, labels_b, _) = read(tmp_path / "a"), read(tmp_path / "b")
    assert vocab_a == vocab_b
    np.testing.assert_array_equal(labels_a, labels_b)
    checksums = [(tmp_path / d / "checksums.json").read_text() for d in ("a", "b")]
    assert checksums[0] == checksums[1]


def test_plural_and_verb_forms_collapse_unknown_words_stay(inflected_json, tmp_path):
    prepare_captions(inflected_json, tmp_path / "plain", min_count=1)
    prepare_captions(inflected_json, tmp_path / "lemma", min_count=1, lemmatizer="simplemma")
    plain, _, _ = read(tmp_path / "plain")
    lemma, labels, _ = read(tmp_path / "lemma")
    assert {"dogs", "dog", "are", "is", "men", "man", "running", "runs"} <= set(plain)
    assert len(lemma) < len(plain)
    assert {"dog", "be", "man", "run", "sit", "zorked"} <= set(lemma)  # zorked: unknown, kept
    assert not {"dogs", "are", "is", "men", "running", "runs"} & set(lemma)  # sitting: a noun too
    dog = lemma.index("dog")
    assert labels[0, 1] == labels[1, 1] == dog  # "two dogs ...", "a dog ...": one word
    assert labels[3, 6] == dog and lemma[labels[3, 5]] == "zorked"
    captions = load_captions(tmp_path / "lemma")
    # "<eos>" stays a word (<unk>, not the end); "barks" is a val word only
    assert captions.vocab.decode(labels[4]) == ["a", "dog", "<unk>", "<unk>"]
    refs = json.loads((tmp_path / "lemma/refs_train.json").read_text())["annotations"]
    assert refs[0]["caption"] == "two dog be run"  # the references: lemmatised too


def refs(folder: Path, split: str) -> dict:
    return json.loads((folder / f"refs_{split}.json").read_text())


def test_references_are_lemmatised_with_the_labels_lemmas(inflected_json, tmp_path):
    prepare_captions(inflected_json, tmp_path / "lemma", min_count=1, lemmatizer="simplemma")
    written = {split: [a["caption"] for a in refs(tmp_path / "lemma", split)["annotations"]]
               for split in ("train", "val", "test")}
    assert written == {
        "train": ["two dog be run", "a dog run on grass", "man sit",
                  "a man be sitting near zorked dog"],
        "val": ["a dog <eos> bark", "dog"],  # untouched: <eos>'s spelling; val-only words too
        "test": ["the man run", "a man"]}
    assert not {"dogs", "are", "is", "men", "running", "runs", "ran", "barks"} & {
        w for captions in written.values() for c in captions for w in c.split()}
    # one code path: a train reference is its caption's labels, word for word
    captions = load_captions(tmp_path / "lemma")
    assert [" ".join(captions.vocab.decode(row)) for row in captions.labels[:4]] == \
        written["train"]
    recorded = {"name": "simplemma", "version": SIMPLEMMA}
    for split in ("train", "val", "test"):
        info = refs(tmp_path / "lemma", split)["info"]
        assert info["lemmatizer"] == recorded and f"lemmatised by simplemma {SIMPLEMMA}" in \
            info["description"]
    from pycocotools.coco import COCO  # pycocoevalcap's loader still reads them
    assert len(COCO(str(tmp_path / "lemma/refs_val.json")).imgToAnns[2]) == 2


def test_without_lemmatize_references_are_untouched(inflected_json, tmp_path):
    prepare_captions(inflected_json, tmp_path / "plain", min_count=1)
    images = json.loads(inflected_json.read_text())["images"]
    for split in ("train", "val", "test"):
        ims = [im for im in images if im["split"] == split]
        expected = {  # the captions as written, byte for byte what prepare always wrote
            "info": {"description": "inflected references, written by capstack prepare"},
            "licenses": [], "type": "captions",
            "images": [{"id": im["imgid"], "file_name": im["filename"]} for im in ims],
            "annotations": [{"image_id": im["imgid"], "id": s["sentid"], "caption": s["raw"]}
                            for im in ims for s in im["sentences"]]}
        assert (tmp_path / f"plain/refs_{split}.json").read_text() == json.dumps(expected)
    assert refs(tmp_path / "plain", "train")["annotations"][0]["caption"] == \
        "Two dogs are running."


def test_cider_cache_and_rewards_read_the_lemmatised_references(inflected_json, tmp_path):
    from trainer.rewards.base import tokenized_references
    from trainer.rewards.cider_cache import build_cache

    prepare_captions(inflected_json, tmp_path / "plain", min_count=1)
    prepare_captions(inflected_json, tmp_path / "lemma", min_count=1, lemmatizer="simplemma")

    def unigram_df(scorer, word):
        key = scorer.words.index(word) * 4  # an order-1 n-gram's key (trainer/rewards/cider.py)
        return scorer.df[np.searchsorted(scorer.ngrams, key)]

    plain = build_cache(tmp_path / "plain", "train", tmp_path / "plain.npz")
    lemma = build_cache(tmp_path / "lemma", "train", tmp_path / "lemma.npz")
    assert "dogs" in plain.words and "dogs" not in lemma.words
    assert unigram_df(plain, "dog") == 1 and unigram_df(lemma, "dog") == 2  # both train images
    assert set(lemma.words) == set(load_captions(tmp_path / "lemma").vocab.itow)  # no raw word
    rewarded = tokenized_references(load_captions(tmp_path / "lemma"))  # BLEU, ROUGE-L, METEOR
    assert rewarded[1] == ["man sit", "a man be sitting near zorked dog"]


def test_lemmas_lowercase_and_specials_untouched():
    lemma = build_lemmatizer("simplemma").lemma
    assert [lemma(w) for w in ("dogs", "are", "men", "i", "tv", "zorked", "<eos>", "")] == \
        ["dog", "be", "man", "i", "tv", "zorked", "<eos>", ""]


def test_the_lemmatiser_and_its_version_are_recorded(shapes_json, tmp_path):
    summary = prepare_captions(shapes_json, tmp_path / "lemma", min_count=2,
                               lemmatizer="simplemma")
    prepare_captions(shapes_json, tmp_path / "plain", min_count=2)
    _, _, attrs = read(tmp_path / "lemma")
    assert (attrs["lemmatizer"], attrs["lemmatizer_version"]) == ("simplemma", SIMPLEMMA)
    recorded = {"name": "simplemma", "version": SIMPLEMMA}
    assert summary["lemmatizer"] == recorded
    assert json.loads((tmp_path / "lemma/summary.json").read_text())["lemmatizer"] == recorded
    _, _, plain = read(tmp_path / "plain")  # without --lemmatize: nothing recorded
    assert "lemmatizer" not in plain and "lemmatizer" not in json.loads(
        (tmp_path / "plain/summary.json").read_text())


def test_another_version_changes_the_checksums(shapes_json, tmp_path, monkeypatch):
    prepare_captions(shapes_json, tmp_path / "now", min_count=2, lemmatizer="simplemma")
    fake_version(monkeypatch, "99.0.0")
    prepare_captions(shapes_json, tmp_path / "other", min_count=2, lemmatizer="simplemma")
    assert read(tmp_path / "other")[2]["lemmatizer_version"] == "99.0.0"
    now, other = (json.loads((tmp_path / d / "checksums.json").read_text())["md5"]
                  for d in ("now", "other"))
    assert now["vocab.json"] == other["vocab.json"]  # the same words (the same dictionaries)
    assert now["captions.h5"] != other["captions.h5"]
    assert now["summary.json"] != other["summary.json"]
    assert now["refs_train.json"] != other["refs_train.json"]  # its info records the version


STAGES = """
stages:
  shapes:
    cmd: capstack shapes data/shapes --train 6 --val 2 --test 2 --seed 0 --size 32
    outs: [data/shapes]
  prepare:
    cmd: capstack prepare data/shapes/dataset_shapes.json data/prepared --min-count 1 --lemmatize
    deps: [data/shapes/dataset_shapes.json]
    outs: [data/prepared]
"""


def test_another_version_makes_the_prepare_stage_stale(capstack, monkeypatch):
    assert code_distributions("pipeline.captions.prepare") == ("simplemma",)
    assert code_distributions("trainer.train") == ()
    (capstack.workdir / "stages.yaml").write_text(STAGES)
    capstack.stage_cmd("demo")
    lock = yaml.safe_load((capstack.workdir / "stages.lock").read_text())["stages"]
    assert lock["prepare"]["code"]["installed simplemma"] == SIMPLEMMA
    assert "installed simplemma" not in lock["shapes"]["code"]
    assert {n: s["state"] for n, s in capstack.statuses().items()} == {
        "shapes": "up to date", "prepare": "up to date"}
    fake_version(monkeypatch, "99.0.0")
    status = capstack.statuses()
    assert status["prepare"]["reasons"] == ["code changed: installed simplemma"]
    assert status["shapes"]["state"] == "up to date"


def test_missing_simplemma_is_named_with_how_to_install(shapes_json, tmp_path, monkeypatch,
                                                       capstack):
    monkeypatch.setitem(sys.modules, "simplemma", None)  # import simplemma -> ImportError
    with pytest.raises(CapstackError, match=r"simplemma package is not installed.*pip install"):
        prepare_captions(shapes_json, tmp_path / "out", lemmatizer="simplemma")
    result = capstack("prepare", shapes_json, tmp_path / "out", "--lemmatize", expect_ok=False)
    assert result.exit_code != 0 and "pip install 'simplemma>=2.0,<3'" in result.output
    assert not (tmp_path / "out").exists()
    with pytest.raises(CapstackError, match="unknown lemmatizer 'nltk'"):
        prepare_captions(shapes_json, tmp_path / "out", lemmatizer="nltk")


def test_cli_lemmatize_end_to_end(shapes_json, tmp_path, capstack):
    plain = capstack("prepare", shapes_json, tmp_path / "plain", "--min-count", "2").output
    out = capstack("prepare", shapes_json, tmp_path / "lemma", "--min-count", "2",
                   "--lemmatize").output
    assert f"lemmatised by simplemma {SIMPLEMMA}" in out and "lemmatised" not in plain
    lemma, words = load_captions(tmp_path / "lemma").vocab, load_captions(tmp_path / "plain").vocab
    assert len(lemma) < len(words)
    assert {"shapes", "is"} <= set(words.itow) and not {"shapes", "is"} & set(lemma.itow)
    assert "--lemmatize" in capstack("prepare", "--help").output


def test_flickr8k_hacap_captions_are_lemmatised():
    stages = yaml.safe_load((REPO / "configs" / "flickr8k.yaml").read_text())["stages"]
    assert stages["prepare_hacap"]["cmd"].endswith(" --lemmatize")
    assert "--lemmatize" not in stages["prepare"]["cmd"]  # Show-Attend-Tell's captions: as written
