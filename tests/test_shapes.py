"""The shapes dataset: deterministic, Karpathy format, boxes on the objects, COCO-like captions."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from pipeline.captions.karpathy import load_karpathy
from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.demo.shapes.captions import captions_for
from pipeline.demo.shapes.free_captions import free_captions_for
from pipeline.demo.shapes.grammar import article, join_list, plural
from pipeline.demo.shapes.relations import extreme, position, relations, spatial_relation
from pipeline.demo.shapes.scene import COLORS, Background, Obj, Scene, sample_scene

SPLITS = {"train": 40, "val": 6, "test": 6}
SIZE = 64


def _files(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _tokens(raw):
    return re.sub(r"[^a-z0-9 ]", "", raw.lower()).split()


def _write(out, seed=3, **splits):
    sizes = {f"n_{k}": v for k, v in (splits or SPLITS).items()}
    return write_shapes_dataset(out, **sizes, seed=seed, size=SIZE, progress=False)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes") / "shapes"
    summary = _write(out)
    return out, summary, json.loads((out / "dataset_shapes.json").read_text())


# -- determinism -----------------------------------------------------------------------------
def test_same_arguments_same_bytes(tmp_path, small_set):
    out, _, _ = small_set
    _write(tmp_path / "again")
    assert _files(tmp_path / "again") == _files(out)


def test_other_seed_other_content(tmp_path, small_set):
    out, _, _ = small_set
    _write(tmp_path / "other", seed=4)
    mine, other = _files(out), _files(tmp_path / "other")
    assert mine.keys() == other.keys()
    assert mine["dataset_shapes.json"] != other["dataset_shapes.json"]
    assert sum(mine[k] != other[k] for k in mine) > 0.9 * len(mine)


def test_image_content_does_not_depend_on_split_sizes(tmp_path, small_set):
    out, _, data = small_set
    _write(tmp_path / "resplit", train=2, val=3, test=1)
    redrawn = json.loads((tmp_path / "resplit" / "dataset_shapes.json").read_text())["images"]
    assert [im["split"] for im in redrawn] == ["train"] * 2 + ["val"] * 3 + ["test"]
    for im in redrawn:
        original = data["images"][im["imgid"]]
        assert (im["sentences"], im["boxes"]) == (original["sentences"], original["boxes"])
        name = f"images/{im['filename']}"
        assert (tmp_path / "resplit" / name).read_bytes() == (out / name).read_bytes()


# -- the Karpathy format ------------------------------------------------------------------------
def test_karpathy_fields_and_ids(small_set):
    out, summary, data = small_set
    assert list(data) == ["dataset", "images"] and data["dataset"] == "shapes"
    images = data["images"]
    n = sum(SPLITS.values())
    assert [im["imgid"] for im in images] == list(range(n))
    assert [im["split"] for im in images] == ["train"] * 40 + ["val"] * 6 + ["test"] * 6
    sentids = []
    for im in images:
        assert set(im) == {"filepath", "filename", "imgid", "split", "sentids", "sentences",
                           "boxes"}
        assert im["filepath"] == "images" and im["filename"] == f"shapes_{im['imgid']:06d}.png"
        assert len(im["sentences"]) == 5 and len(im["sentids"]) == 5
        assert im["sentids"] == [s["sentid"] for s in im["sentences"]]
        for s in im["sentences"]:
            assert set(s) == {"tokens", "raw", "imgid", "sentid"}
            assert s["imgid"] == im["imgid"] and isinstance(s["sentid"], int)
            assert isinstance(s["raw"], str) and s["raw"][0].isupper() and s["raw"][-1] == "."
            assert s["tokens"] == _tokens(s["raw"]) and all(isinstance(t, str) for t in s["tokens"])
        sentids += im["sentids"]
    assert len(sentids) == len(set(sentids)) == 5 * n
    words = {t for im in images for s in im["sentences"] for t in s["tokens"]}
    assert summary == {"json": str(out / "dataset_shapes.json"), "images": n, "splits": SPLITS,
                       "captions": 5 * n, "caption_style": "grammar", "words": len(words)}


def test_the_project_reader_accepts_it(small_set):
    out, _, _ = small_set
    dataset = load_karpathy(out / "dataset_shapes.json")
    assert len(dataset.split("train")) == 40 and len(dataset.split("test")) == 6
    assert all((out / im.relpath).is_file() for im in dataset.images)
    assert all(im.extra["boxes"] for im in dataset.images)


def test_images_are_square_rgb_pngs(small_set):
    out, _, data = small_set
    assert sorted(p.name for p in (out / "images").iterdir()) == \
        sorted(im["filename"] for im in data["images"])
    with Image.open(out / "images" / data["images"][0]["filename"]) as img:
        assert (img.format, img.mode, img.size) == ("PNG", "RGB", (SIZE, SIZE))


# -- boxes ---------------------------------------------------------------------------------------
def test_boxes_are_tight_around_pixels_of_the_named_colour(small_set):
    out, _, data = small_set
    for im in data["images"]:
        pixels = np.asarray(Image.open(out / "images" / im["filename"]).convert("RGB"))
        assert 1 <= len(im["boxes"]) <= 4
        for b in im["boxes"]:
            assert set(b) == {"box", "label", "shape", "color", "size"}
            assert b["label"] == b["shape"] and b["size"] in ("small", "medium", "large")
            x1, y1, x2, y2 = b["box"]
            assert all(isinstance(v, int) for v in b["box"])
            assert 0 <= x1 < x2 <= SIZE and 0 <= y1 < y2 <= SIZE
            painted = (pixels[y1:y2, x1:x2] == COLORS[b["color"]]).all(axis=2)
            assert painted[(y2 - y1) // 2, (x2 - x1) // 2], (im["filename"], b)  # the centre
            assert painted.mean() > 0.25, (im["filename"], b)  # a star fills about 40 %
            # tight: every edge row and column of the box holds a pixel of the object
            assert painted[0].any() and painted[-1].any()
            assert painted[:, 0].any() and painted[:, -1].any()


def test_objects_do_not_overlap(small_set):
    _, _, data = small_set
    for im in data["images"]:
        boxes = [b["box"] for b in im["boxes"]]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                overlap_w = min(a[2], b[2]) - max(a[0], b[0])
                overlap_h = min(a[3], b[3]) - max(a[1], b[1])
                smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
                assert max(overlap_w, 0) * max(overlap_h, 0) <= 0.15 * smaller


# -- geometry ------------------------------------------------------------------------------------
def _obj(shape="circle", color="red", cx=50.0, cy=50.0, r=6.0, size="small"):
    return Obj(shape, color, size, cx, cy, r)


def test_relation_of_a_clearly_left_object_is_left_of():
    a, b = _obj(cx=15, cy=50), _obj("square", "blue", cx=80, cy=55)
    assert spatial_relation(a, b) == "left of" and spatial_relation(b, a) == "right of"
    top, bottom = _obj(cx=50, cy=10), _obj(cx=55, cy=90)
    assert spatial_relation(top, bottom) == "above" and spatial_relation(bottom, top) == "below"
    assert relations(a, b, 100)[0] == "left of"


def test_next_to_near_and_diagonal_follow_distances():
    a, close = _obj(cx=30, cy=50), _obj(cx=50, cy=52)
    assert relations(a, close, 100)[:1] == ["left of"]
    assert {"next to", "near"} <= set(relations(a, close, 100))
    far = _obj(cx=95, cy=50)
    assert "near" not in relations(a, far, 100) and "next to" not in relations(a, far, 100)
    corner, opposite = _obj(cx=10, cy=10), _obj(cx=90, cy=90)
    assert "above and left of" in relations(corner, opposite, 100)


def test_positions_and_extremes():
    assert position(_obj(cx=10, cy=10), 100) == "top left"
    assert position(_obj(cx=50, cy=50), 100) == "center"
    assert position(_obj(cx=90, cy=50), 100) == "right"
    assert position(_obj(cx=50, cy=95), 100) == "bottom"
    objects = (_obj(cx=10, cy=50), _obj(cx=60, cy=20), _obj(cx=65, cy=80))
    assert extreme(objects, "leftmost", 100) is objects[0]
    assert extreme(objects, "rightmost", 100) is None  # 60 vs 65: too close to call


# -- captions ------------------------------------------------------------------------------------
CIRCLE_WORDS = {"circle", "disc", "ball", "dot", "orb"}
SQUARE_WORDS = {"square", "box", "block", "tile", "quadrilateral"}
PICTURE_WORDS = {"picture", "image", "photo", "drawing", "illustration", "snapshot"}


def _two_object_scene():
    objects = (_obj("circle", "red", cx=20, cy=50, r=8),
               _obj("square", "blue", cx=78, cy=52, r=14, size="large"))
    return Scene(100, objects, Background("white", "plain"))


def test_captions_of_a_hand_built_scene_are_true():
    scene = _two_object_scene()
    for seed in range(60):
        for caption in captions_for(scene, np.random.default_rng(seed)):
            tokens = _tokens(caption)
            assert not ({"green", "yellow", "triangle", "star", "three", "above", "below"}
                        & set(tokens))
            text = " ".join(tokens)
            for relation, first_words, second_words in (("left of", CIRCLE_WORDS, SQUARE_WORDS),
                                                        ("right of", SQUARE_WORDS, CIRCLE_WORDS)):
                before, _, after = text.partition(relation)
                if after and after.split()[1] not in PICTURE_WORDS:  # not "left of the image"
                    assert set(before.split()) & first_words, caption
                    assert set(after.split()) & second_words, caption


def test_captions_vary_and_use_relations(small_set):
    _, _, data = small_set
    distinct = [len({s["raw"] for s in im["sentences"]}) for im in data["images"]]
    assert sum(d >= 3 for d in distinct) >= 0.9 * len(distinct)
    words = Counter(t for im in data["images"] for s in im["sentences"] for t in s["tokens"])
    assert words["left"] + words["right"] > 10 and words["above"] + words["below"] > 3
    assert sum(words[n] for n in ("two", "three", "four")) > 10


@pytest.fixture(scope="module")
def many_captions():
    """Captions of 600 scenes, as the dataset draws them (scene, then captions, same rng)."""
    out = []
    for imgid in range(600):
        rng = np.random.default_rng([0, imgid])
        out += captions_for(sample_scene(rng, 128), rng)
    return out


def test_word_frequencies_have_a_long_tail(many_captions):
    counts = Counter(t for c in many_captions for t in _tokens(c))
    top = [n for _, n in counts.most_common(10)]
    assert min(top) > 300
    rare = [w for w, n in counts.items() if n < 5]
    assert len(rare) >= 5, counts


def test_caption_lengths_are_coco_like(many_captions):
    lengths = np.array([len(_tokens(c)) for c in many_captions])
    assert 7 <= np.median(lengths) <= 12
    assert ((lengths >= 5) & (lengths <= 14)).mean() > 0.8
    assert 0.005 < (lengths > 16).mean() < 0.1  # a few are cut by --max-len 16


@pytest.mark.parametrize("style", ["grammar", "free"])
def test_articles_agree_with_the_next_word(style, many_captions, many_free_captions):
    vowel_exceptions = {"one"}
    captions = many_captions if style == "grammar" else \
        [c for five in many_free_captions for c in five]
    for caption in captions:
        tokens = _tokens(caption)
        for word, following in zip(tokens, tokens[1:]):
            starts_with_vowel = following[0] in "aeiou" and following not in vowel_exceptions
            if word == "a":
                assert not starts_with_vowel, caption
            elif word == "an":
                assert starts_with_vowel, caption


def test_grammar_helpers():
    assert article("orange star") == "an" and article("hexagon") == "a"
    assert article("one") == "a" and article("oval") == "an"
    assert plural("box") == "boxes" and plural("cross") == "crosses"
    assert plural("plus sign") == "plus signs" and plural("circle") == "circles"
    assert join_list(["a"]) == "a" and join_list(["a", "b"]) == "a and b"
    assert join_list(["a", "b", "c"]) == "a, b and c"


# -- the command's behaviour -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(size=8), "shapes: --size must be at least 32, got 8"),
    (dict(n_train=-1), "shapes: --train must be >= 0, got -1"),
    (dict(n_val=-2), "shapes: --val must be >= 0, got -2"),
    (dict(n_train=0, n_val=0, n_test=0), "at least one image"),
    (dict(seed=-1), "--seed must be >= 0"),
    (dict(n_test=1.5), "--test must be an integer"),
])
def test_bad_arguments_raise_and_write_nothing(tmp_path, kwargs, message):
    args = dict(n_train=2, n_val=1, n_test=1, size=SIZE, progress=False) | kwargs
    with pytest.raises(CapstackError, match=re.escape(message)):
        write_shapes_dataset(tmp_path / "x", **args)
    assert list(tmp_path.iterdir()) == []


def test_rewriting_replaces_the_old_output_and_reports_progress(tmp_path, capsys):
    out = tmp_path / "shapes"
    _write(out, train=3, val=0, test=0)
    (out / "images" / "stale.png").write_bytes(b"old")
    summary = write_shapes_dataset(out, n_train=2, n_val=0, n_test=1, size=SIZE, progress=True)
    assert summary["splits"] == {"train": 2, "val": 0, "test": 1}
    assert sorted(p.name for p in (out / "images").iterdir()) == \
        [f"shapes_{k:06d}.png" for k in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes"]  # no temporary left over
    captured = capsys.readouterr()
    assert "shapes" in captured.err and captured.out == ""


# -- free captions (--captions free) -----------------------------------------------------------
def _free_captions(scene, seed):
    return free_captions_for(scene, np.random.default_rng(seed))


@pytest.fixture(scope="module")
def free_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes") / "free"
    summary = write_shapes_dataset(out, n_train=40, n_val=6, n_test=6, seed=3, size=SIZE,
                                   progress=False, captions="free")
    return out, summary, json.loads((out / "dataset_shapes.json").read_text())


def test_free_captions_share_images_ids_splits_and_boxes_with_the_grammar(small_set, free_set):
    grammar_dir, grammar_summary, grammar = small_set
    free_dir, free_summary, free = free_set
    g_files, f_files = _files(grammar_dir), _files(free_dir)
    assert g_files.keys() == f_files.keys()
    assert {k: v for k, v in g_files.items() if k != "dataset_shapes.json"} == \
        {k: v for k, v in f_files.items() if k != "dataset_shapes.json"}
    assert list(grammar) == ["dataset", "images"]  # the default's json as it always was
    assert list(free) == ["dataset", "caption_style", "images"] and free["caption_style"] == "free"
    assert len(grammar["images"]) == len(free["images"])
    for g, f in zip(grammar["images"], free["images"]):
        assert {k: v for k, v in g.items() if k != "sentences"} == \
            {k: v for k, v in f.items() if k != "sentences"}
        assert [s["sentid"] for s in g["sentences"]] == [s["sentid"] for s in f["sentences"]]
        assert {s["raw"] for s in g["sentences"]} != {s["raw"] for s in f["sentences"]}
    assert grammar_summary["caption_style"] == "grammar" and free_summary["caption_style"] == "free"
    same = ("images", "splits", "captions")
    assert {k: grammar_summary[k] for k in same} == {k: free_summary[k] for k in same}


def test_grammar_captions_come_from_the_scene_generator_as_before(small_set):
    """The default's sentences are still drawn right after the scene from one generator."""
    _, _, data = small_set
    for im in data["images"][:10]:
        rng = np.random.default_rng([3, im["imgid"]])
        expected = captions_for(sample_scene(rng, SIZE), rng)
        assert [s["raw"] for s in im["sentences"]] == expected


def test_free_captions_same_seed_same_bytes(tmp_path, free_set):
    out, _, _ = free_set
    write_shapes_dataset(tmp_path / "again", n_train=40, n_val=6, n_test=6, seed=3, size=SIZE,
                         progress=False, captions="free")
    assert _files(tmp_path / "again") == _files(out)


def test_free_captions_follow_the_karpathy_format(free_set):
    out, _, data = free_set
    dataset = load_karpathy(out / "dataset_shapes.json")
    assert len(dataset.split("train")) == 40
    for im in data["images"]:
        assert len(im["sentences"]) == 5
        assert len({s["raw"] for s in im["sentences"]}) == 5  # the five differ
        for s in im["sentences"]:
            assert s["raw"][0].isupper() and s["raw"].endswith(".") and "  " not in s["raw"]
            assert s["tokens"] == _tokens(s["raw"])


def test_bad_caption_style_is_refused(tmp_path):
    with pytest.raises(CapstackError, match="--captions must be one of grammar, free"):
        write_shapes_dataset(tmp_path / "x", n_train=1, n_val=0, n_test=0, size=SIZE,
                             progress=False, captions="poetic")
    assert list(tmp_path.iterdir()) == []


def test_the_command_takes_the_caption_style(tmp_path):
    from click.testing import CliRunner

    import cli

    out = tmp_path / "free"
    result = CliRunner().invoke(cli.main, ["shapes", str(out), "--train", "2", "--val", "0",
                                           "--test", "1", "--size", "32", "--captions", "free"])
    assert result.exit_code == 0, result.output
    assert "15 captions (free style)" in result.output
    assert json.loads((out / "dataset_shapes.json").read_text())["caption_style"] == "free"
    result = CliRunner().invoke(cli.main, ["shapes", str(tmp_path / "bad"), "--captions", "x"])
    assert result.exit_code != 0 and "--captions" in result.output


FREE_SHAPE_WORDS = {
    "circle": {"circle", "disc", "dot", "round", "ball"},
    "ellipse": {"oval", "ellipse"},
    "square": {"square", "box", "block"},
    "diamond": {"diamond", "rhombus"},
    "triangle": {"triangle", "triangular"},
    "star": {"star", "pointed"},
    "hexagon": {"hexagon", "sided"},
    "cross": {"cross", "plus"},
}
FREE_SHAPE_OF = {w: shape for shape, words in FREE_SHAPE_WORDS.items()
                 for w in words | {plural(w) for w in words}}
FREE_COLOR_OF = {"red": "red", "scarlet": "red", "orange": "orange", "yellow": "yellow",
                 "golden": "yellow", "green": "green", "blue": "blue", "purple": "purple",
                 "violet": "purple", "pink": "pink", "brown": "brown", "black": "black",
                 "gray": "gray", "grey": "gray"}
FREE_SIZE_OF = {"small": "small", "little": "small", "tiny": "small", "medium": "medium",
                "big": "large", "large": "large", "huge": "large"}


def test_free_captions_of_a_hand_built_scene_are_true():
    """A small red circle far to the left of a big blue square, level with it."""
    scene = _two_object_scene()
    said = Counter()
    for seed in range(150):
        for caption in _free_captions(scene, seed):
            tokens = _tokens(caption)
            said.update(tokens)
            assert not {"green", "yellow", "triangle", "star", "three", "four", "above", "below",
                        "over", "under", "beneath", "higher", "lower", "top", "bottom", "upper",
                        "corner", "center", "middle", "next", "beside", "near", "close", "just",
                        "well", "both", "all", "medium"} & set(tokens), caption
            shapes = [FREE_SHAPE_OF[t] for t in tokens if t in FREE_SHAPE_OF]
            for i, t in enumerate(tokens):
                after = [FREE_SHAPE_OF[x] for x in tokens[i + 1:i + 8] if x in FREE_SHAPE_OF]
                if t in ("left", "right") and tokens[i + 1:i + 2] == ["of"] and \
                        tokens[i + 3:i + 4] not in (["image"], ["picture"], ["drawing"],
                                                    ["illustration"]):
                    # what follows "left of" is what the subject is left of: the square
                    assert after[:1] == ["square" if t == "left" else "circle"], caption
                if t == "its":  # "a box with a red circle to its left": the anchor comes first
                    assert shapes[0] == ("square" if tokens[i + 1] == "left" else "circle"), caption
                if t in ("bigger", "larger") and tokens[i + 1:i + 2] == ["than"]:
                    assert after[:1] == ["circle"], caption
                if t == "smaller" and tokens[i + 1:i + 2] == ["than"]:
                    assert after[:1] == ["square"], caption
                if t in FREE_COLOR_OF:  # a colour before a shape word is that shape's
                    following = [x for x in tokens[i + 1:i + 3] if x != "colored"][:1]
                    if following and following[0] in FREE_SHAPE_OF:
                        expected = {"red": "circle", "blue": "square"}[FREE_COLOR_OF[t]]
                        assert FREE_SHAPE_OF[following[0]] == expected, caption
                if t == "far":
                    assert tokens[i + 1] in ("left", "right"), caption  # "on the far left"
    # the wording varies as the brief asks: synonyms, frames, adverbs, determiners
    assert said["box"] and said["block"] and said["square"] and said["disc"] and said["dot"]
    assert said["its"] and said["seen"] and said["directly"] and said["the"] and said["one"]


def test_free_captions_only_name_what_is_drawn():
    for imgid in range(300):
        scene = sample_scene(np.random.default_rng([1, imgid]), 128)
        shapes = Counter(o.shape for o in scene.objects)
        n = len(scene.objects)
        for caption in _free_captions(scene, [1, imgid, 9]):
            tokens = _tokens(caption)
            named = {FREE_SHAPE_OF[t] for t in tokens if t in FREE_SHAPE_OF}
            assert named <= set(shapes), (caption, scene.objects)
            colors = {FREE_COLOR_OF[t] for i, t in enumerate(tokens)
                      if t in FREE_COLOR_OF and (i == 0 or tokens[i - 1] not in ("light", "pale"))}
            assert colors <= {o.color for o in scene.objects}, (caption, scene.objects)
            sizes = {FREE_SIZE_OF[t] for t in tokens if t in FREE_SIZE_OF}
            assert sizes <= {o.size for o in scene.objects}, (caption, scene.objects)
            numbers = {k for k, word in ((2, "two"), (3, "three"), (4, "four")) if word in tokens}
            assert all(k <= n for k in numbers), (caption, scene.objects)
            if n == 1:
                assert not {"two", "three", "four", "both", "all", "other"} & set(tokens), caption


@pytest.fixture(scope="module")
def many_free_captions():
    """Free captions of 600 scenes, as the dataset draws them."""
    from pipeline.demo.shapes.writer import make_example

    return [make_example(0, imgid, 128, "free").captions for imgid in range(600)]


def test_free_captions_are_freer_than_the_grammar(many_captions, many_free_captions):
    free = [c for five in many_free_captions for c in five]
    assert all(len(set(five)) == 5 for five in many_free_captions)

    def starts(captions):  # how sentences begin: a proxy for the number of frames
        return len({tuple(_tokens(c)[:2]) for c in captions})

    assert starts(free) > 1.3 * starts(many_captions)
    counts = Counter(t for c in free for t in _tokens(c))
    assert len(counts) < 300  # a modest vocabulary ...
    assert sum(n >= 5 for n in counts.values()) >= 0.95 * len(counts)  # ... that survives
    lengths = np.array([len(_tokens(c)) for c in free])
    assert 8 <= np.median(lengths) <= 12 and (lengths > 16).mean() < 0.1
