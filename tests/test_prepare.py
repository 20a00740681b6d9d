"""Karpathy reader and the prepare stage, checked against hand counts on tiny jsons."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from conftest import karpathy_image
from pipeline.captions.karpathy import load_karpathy, tokenize
from pipeline.captions.prepare import prepare_captions
from pipeline.captions.vocab import Vocabulary
from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from process_helpers import last_line, run_capstack


def write(tmp_path, data, name="dataset.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.fixture
def coco_like(tmp_path):
    """COCO-like: cocoid, filepath, a restval image, mixed-case tokens, a raw-only sentence."""
    images = [
        karpathy_image(0, "train", ["A dog runs", "a dog sits"], cocoid=500, filepath="train2014"),
        karpathy_image(1, "restval", ["a cat sits on a mat", "a dog and a cat"], cocoid=501,
                       filepath="val2014"),
        karpathy_image(2, "val", ["a zebra sits", "zebra zebra zebra"], cocoid=502,
                       filepath="val2014"),
        karpathy_image(3, "test", ["a bird", "a dog flies"], cocoid=503, filepath="val2014"),
    ]
    del images[1]["sentences"][1]["tokens"]
    images[1]["sentences"][1]["raw"] = "A dog, and a CAT!"
    return write(tmp_path, {"dataset": "coco", "images": images})


@pytest.fixture
def flickr_like(tmp_path):
    """Flickr-like: no filepath, no cocoid."""
    images = [karpathy_image(i, s, ["two men", "a man"]) for i, s in
              enumerate(["train", "train", "val", "test"])]
    for im in images:
        assert "filepath" not in im and "cocoid" not in im
    return write(tmp_path, {"dataset": "flickr8k", "images": images}, "dataset_flickr8k.json")


def test_reader_on_coco_like(coco_like):
    ds = load_karpathy(coco_like)
    assert ds.name == "coco"
    assert [im.image_id for im in ds.images] == [500, 501, 502, 503]
    assert [im.split for im in ds.images] == ["train", "restval", "val", "test"]
    assert ds.images[0].sentences[0].tokens == ("a", "dog", "runs")  # lowercased
    assert ds.images[1].sentences[1].tokens == ("a", "dog", "and", "a", "cat")  # from raw
    assert ds.images[1].relpath == "val2014/img_1.jpg"
    assert [im.image_id for im in ds.split("train")] == [500, 501]


def test_reader_on_flickr_like(flickr_like):
    ds = load_karpathy(flickr_like)
    assert [im.image_id for im in ds.images] == [0, 1, 2, 3]
    assert ds.images[0].filepath == "" and ds.images[0].relpath == "img_0.jpg"


def test_tokenize_like_karpathy():
    assert tokenize("A man, riding a HORSE!\n") == ("a", "man", "riding", "a", "horse")


def test_prepare_matches_hand_count(coco_like, tmp_path):
    out = tmp_path / "prepared"
    summary = prepare_captions(coco_like, out, min_count=2, max_len=4)
    # train + restval tokens: a x6 (runs, sits, cat-sits-on-a-mat x2, dog-and-a-cat x2) ...
    #   a: 1+1+2+2 = 6, dog: 1+1+1 = 3, sits: 1+1 = 2, cat: 1+1 = 2; runs/on/mat/and: 1
    # val/test words (zebra x4, bird, flies) are not counted.
    vocab = Vocabulary.load(out / "vocab.json")
    assert vocab.itow == ["<pad>", "<bos>", "<eos>", "<unk>", "a", "dog", "cat", "sits"]
    a, dog, cat, sits, unk = 4, 5, 6, 7, 3
    with h5py.File(out / "captions.h5") as f:
        labels = f["labels"][:]
        assert labels.shape == (8, 4)
        np.testing.assert_array_equal(labels, [
            [a, dog, unk, 0],        # a dog runs
            [a, dog, sits, 0],       # a dog sits
            [a, cat, sits, unk],     # a cat sits on | a mat (truncated at 4)
            [a, dog, unk, a],        # a dog and a | cat
            [a, unk, sits, 0],       # a zebra sits
            [unk, unk, unk, 0],      # zebra zebra zebra
            [a, unk, 0, 0],          # a bird
            [a, dog, unk, 0],        # a dog flies
        ])
        np.testing.assert_array_equal(f["lengths"][:], [3, 3, 4, 4, 3, 3, 2, 3])
        np.testing.assert_array_equal(f["label_start"][:], [0, 2, 4, 6])
        np.testing.assert_array_equal(f["label_end"][:], [2, 4, 6, 8])
        np.testing.assert_array_equal(f["image_ids"][:], [500, 501, 502, 503])
        np.testing.assert_array_equal(f["split"][:], [0, 0, 1, 2])
        assert list(f["split"].attrs["split_names"]) == ["train", "val", "test"]
        assert f.attrs["vocab_size"] == 8 and f.attrs["max_len"] == 4
    assert summary["images"] == {"train": 2, "val": 1, "test": 1}
    assert summary["captions"] == {"train": 4, "val": 2, "test": 2}
    assert summary["vocab_size"] == 8
    assert summary["unk_tokens"] == 4  # runs, on, mat, and
    assert summary["truncated"] == 2
    assert json.loads((out / "summary.json").read_text()) == summary


def test_the_rtl_rule_keeps_words_of_every_split_seen_more_than_min_count_first_seen_first(
        coco_like, tmp_path, capstack):
    """self-critical.pytorch's prepro_labels.py rule, by hand on the same json as above. Every
    split's tokens, first seen first: a 9, dog 4, runs 1, sits 3, cat 2, on 1, mat 1, and 1,
    zebra 4, bird 1, flies 1. Seen more than 2 times: a, dog, sits, zebra (the default rule
    keeps cat, seen twice in train, and not zebra, a val/test word)."""
    capstack("prepare", coco_like, tmp_path / "p", "--min-count", 2, "--max-len", 4,
             "--vocab-rule", "rtl")
    vocab = Vocabulary.load(tmp_path / "p" / "vocab.json")
    assert vocab.itow[4:] == ["a", "dog", "sits", "zebra"] and vocab.rule == "rtl"
    a, dog, sits, zebra, unk = 4, 5, 6, 7, 3
    with h5py.File(tmp_path / "p" / "captions.h5") as f:
        np.testing.assert_array_equal(f["labels"][:], [
            [a, dog, unk, 0], [a, dog, sits, 0], [a, unk, sits, unk], [a, dog, unk, a],
            [a, zebra, sits, 0], [zebra, zebra, zebra, 0], [a, unk, 0, 0], [a, dog, unk, 0]])
        assert f.attrs["vocab_rule"] == "rtl"
    assert json.loads((tmp_path / "p" / "summary.json").read_text())["vocab_rule"] == "rtl"
    default = prepare_captions(coco_like, tmp_path / "d", min_count=2, max_len=4)
    assert default["vocab_rule"] == "capstack"
    assert Vocabulary.load(tmp_path / "d" / "vocab.json").itow[4:] == ["a", "dog", "cat", "sits"]
    result = capstack("prepare", coco_like, tmp_path / "x", "--vocab-rule", "nltk",
                      expect_ok=False)
    assert result.exit_code == 2 and "'nltk' is not one of 'capstack', 'rtl'" in result.output


def test_restval_drop_leaves_the_restval_images_out_of_every_file(coco_like, tmp_path, capstack):
    """The json above without image 501 (restval): train is image 500 alone (a dog runs, a dog
    sits: a and dog seen twice), the rows renumbered."""
    capstack("prepare", coco_like, tmp_path / "p", "--min-count", 2, "--max-len", 4,
             "--restval", "drop")
    assert Vocabulary.load(tmp_path / "p" / "vocab.json").itow[4:] == ["a", "dog"]
    with h5py.File(tmp_path / "p" / "captions.h5") as f:
        np.testing.assert_array_equal(f["image_ids"][:], [500, 502, 503])
        np.testing.assert_array_equal(f["split"][:], [0, 1, 2])
        np.testing.assert_array_equal(f["label_start"][:], [0, 2, 4])
        assert f["labels"].shape == (6, 4) and f.attrs["restval"] == "drop"
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["images"] == {"train": 1, "val": 1, "test": 1} and summary["restval"] == "drop"
    assert json.loads((tmp_path / "p" / "images_val.json").read_text())[0]["row"] == 1
    refs = json.loads((tmp_path / "p" / "refs_train.json").read_text())
    assert [im["id"] for im in refs["images"]] == [500]
    restval_only = write(tmp_path, {"images": [karpathy_image(0, "restval", ["a dog"]),
                                               karpathy_image(1, "val", ["a cat"])]}, "r.json")
    with pytest.raises(CapstackError, match="--restval drop leaves no train image"):
        prepare_captions(restval_only, tmp_path / "q", min_count=1, restval="drop")


def test_prepare_writes_references_and_image_order(coco_like, tmp_path):
    out = tmp_path / "prepared"
    prepare_captions(coco_like, out, min_count=2, max_len=4)
    refs = json.loads((out / "refs_train.json").read_text())
    assert refs["type"] == "captions"
    assert [im["id"] for im in refs["images"]] == [500, 501]
    assert refs["annotations"][3] == {"image_id": 501, "id": 11, "caption": "A dog, and a CAT!"}
    assert refs["annotations"][2]["caption"] == "A cat sits on a mat."  # untruncated raw
    order = json.loads((out / "images_test.json").read_text())
    assert order == [{"image_id": 503, "row": 3, "filepath": "val2014", "filename": "img_3.jpg"}]
    # pycocoevalcap's own loader reads the references
    from pycocotools.coco import COCO
    coco = COCO(str(out / "refs_val.json"))
    assert coco.getImgIds() == [502] and len(coco.imgToAnns[502]) == 2


def test_prepare_flickr_like(flickr_like, tmp_path):
    summary = prepare_captions(flickr_like, tmp_path / "p", min_count=2)
    # train: "two men", "a man" twice -> every word seen twice; ties sort alphabetically
    assert Vocabulary.load(tmp_path / "p" / "vocab.json").itow[4:] == ["a", "man", "men", "two"]
    assert summary["images"] == {"train": 2, "val": 1, "test": 1}
    order = json.loads((tmp_path / "p" / "images_val.json").read_text())
    assert order == [{"image_id": 2, "row": 2, "filepath": "", "filename": "img_2.jpg"}]


def test_vocabulary_round_trip(tmp_path):
    vocab = Vocabulary(["b", "a", "c"], {"b": 2, "a": 1, "c": 1}, min_count=1, rule="rtl")
    vocab.save(tmp_path / "v.json")
    again = Vocabulary.load(tmp_path / "v.json")
    assert again == vocab
    assert (again.rule, again.min_count, again.counts) == ("rtl", 1, vocab.counts)
    assert again.decode(again.encode(["a", "zzz", "c"]) + [2, 4]) == ["a", "<unk>", "c"]


BAD = {
    "not json": ("{oops", "not valid JSON (line 1 column 2"),
    "no images": ({"dataset": "x"}, 'missing top-level "images" list'),
    "no split": ({"images": [{"imgid": 7, "filename": "a", "sentences": []}]},
                 'images[0] (imgid 7): missing "split"'),
    "no sentences": ({"images": [{"imgid": 7, "filename": "a", "split": "train"}]},
                     'images[0] (imgid 7): missing "sentences"'),
    "empty tokens": ({"images": [{"imgid": 7, "filename": "a", "split": "train",
                                  "sentences": [{"tokens": [], "raw": "a b", "sentid": 1}]}]},
                     "images[0] (imgid 7).sentences[0]: empty tokens"),
    "unknown split": ({"images": [{"imgid": 7, "filename": "a", "split": "dev",
                                   "sentences": [{"tokens": ["a"]}]}]},
                      "images[0] (imgid 7).split: unknown split 'dev'"),
    "duplicate ids": ({"images": [karpathy_image(1, "train", ["a"]),
                                  karpathy_image(1, "train", ["b"])]},
                      "images[1]: duplicate image id 1 (also images[0])"),
    "no imgid": ({"images": [{"filename": "a"}]}, 'images[0]: missing "imgid"'),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_dataset_json_writes_nothing(tmp_path, case):
    data, fragment = BAD[case]
    path = write(tmp_path, data)
    with pytest.raises(CapstackError) as err:
        prepare_captions(path, tmp_path / "out")
    assert str(err.value).startswith(str(path)) and fragment in str(err.value)
    assert not (tmp_path / "out").exists()


def test_bad_input_leaves_previous_output_untouched(coco_like, tmp_path):
    out = tmp_path / "out"
    prepare_captions(coco_like, out, min_count=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(CapstackError):
        prepare_captions(write(tmp_path, "[]", "bad.json"), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_cli_reports_bad_json_in_one_line(capstack, tmp_path):
    path = write(tmp_path, {"images": [{"imgid": 7, "filename": "a", "split": "train"}]})
    result = capstack("prepare", path, tmp_path / "out", expect_ok=False)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.strip() == f'Error: {path}: images[0] (imgid 7): missing "sentences"'
    assert not (tmp_path / "out").exists()


def test_missing_file_and_bad_options(tmp_path, coco_like):
    with pytest.raises(CapstackError, match="dataset json not found"):
        prepare_captions(tmp_path / "nope.json", tmp_path / "out")
    with pytest.raises(CapstackError, match="--min-count must be at least 1"):
        prepare_captions(coco_like, tmp_path / "out", min_count=0)


def test_prepare_on_a_full_disk_says_so_in_one_line(tmp_path, small_disk):
    disk = small_disk("disk", "100k")
    write_shapes_dataset(tmp_path / "big", n_train=2000, n_val=10, n_test=10, seed=0, size=32)
    result = run_capstack("prepare", tmp_path / "big" / "dataset_shapes.json", disk / "prep",
                          "--min-count", "1", cwd=tmp_path, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"Error: {disk / 'prep'}: cannot write it (No space left on device); nothing written "
        f"before was changed: make room or choose another place, then run again")
    assert not list(disk.iterdir())


@pytest.mark.parametrize("case", ["no train images", "an empty vocabulary"])
def test_prepare_refuses_a_dataset_no_training_could_use(tmp_path, case):
    write_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, n_test=2, seed=0, size=32)
    dataset = tmp_path / "shapes" / "dataset_shapes.json"
    args = ["--min-count", "1"]
    if case == "no train images":
        data = json.loads(dataset.read_text())
        for image in data["images"]:
            image["split"] = "val" if image["split"] == "train" else image["split"]
        dataset.write_text(json.dumps(data))
        problem = ("no train captions (images by split: train 0, val 6, test 2); the "
                   "vocabulary is chosen from them, and training needs them")
    else:
        args = ["--min-count", "1000"]
        problem = ("the vocabulary is empty: the rule 'capstack' keeps no word of the train "
                   "captions with --min-count 1000 (the most frequent, 'a', occurs ")
    result = run_capstack("prepare", dataset, "prepared", *args, cwd=tmp_path)
    assert result.returncode == 1  # was: 0, and a prepared folder no training could use
    assert last_line(result).startswith(f"Error: {dataset}: {problem}")
    assert not (tmp_path / "prepared").exists()
