"""The report's page (trainer/evaluation/page/) and the comparison's figure: a trained run's
evaluation against a results file's, written by the commands, read back as the page holds it;
and, marked slow, the page in headless Chromium."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import cli
from trainer.evaluation.page.rows import word_diff

EDITED = "a purple elephant under </script><b>the</b> sea"  # no HTML: text


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory):
    """A soft-attention run on tiny shapes data, evaluated with two captions per image and
    attention pictures (evals/run); a results file of the same captions but two images'
    rewritten, evaluated with --refs (evals/edited). Scored without Java."""
    from pipeline.captions.prepared import load_captions
    from trainer.config import load_experiment
    from trainer.evaluation.evaluate import evaluate_checkpoint
    from trainer.train import train
    from trainer_fixtures import make_prepared, write_experiment, write_feature_store

    root = tmp_path_factory.mktemp("page")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", str(root))  # no java: the simple tokenizer, METEOR n/a
        dataset, prepared = make_prepared(root)
        store = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids,
                                    image_root=dataset.parent)
        experiment = write_experiment(root / "soft.yaml", decoder="soft_attention",
                                      captions=prepared, features=[store], epochs=1)
        train(load_experiment(experiment), root / "runs" / "soft", progress=False)
        evaluate_checkpoint(root / "runs" / "soft", root / "evals" / "run", beam_size=2,
                            figures=2, spice=False, decoding={"n": 2})
        results = json.loads((root / "evals" / "run" / "results_test.json").read_text())
        firsts = [r for r in results if r["rank"] == 1]
        edited = [{"image_id": r["image_id"],
                   "caption": EDITED if k in (1, 2) else r["caption"]}
                  for k, r in enumerate(firsts)]
        (root / "edited.json").write_text(json.dumps(edited))
        done = CliRunner().invoke(cli.main, ["evaluate", str(root / "edited.json"), "--refs",
                                             str(prepared / "refs_test.json"), "--out",
                                             str(root / "evals" / "edited")],
                                  catch_exceptions=False)
        assert done.exit_code == 0, done.output
    return root, [r["image_id"] for r in firsts], {r["image_id"]: r["caption"] for r in firsts}


def page_data(path) -> dict:
    """The rows a page embeds (its <script id="page-data">)."""
    text = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', text,
                      re.S)
    assert found, "no page data"
    return json.loads(found.group(1))


def report(*args: str, ok: bool = True):
    done = CliRunner().invoke(cli.main, ["report", *map(str, args)])
    if ok:
        assert done.exit_code == 0, done.output
    return done


def test_word_diff_marks_the_words_outside_the_matching_blocks():
    assert word_diff("a red circle on the left", "a blue circle on the right") == ([1, 5],
                                                                                   [1, 5])
    assert word_diff("a dog", "a dog") == ([], [])
    assert word_diff("", "two cats") == ([], [0, 1])


def test_the_comparison_page_lists_the_images_whose_captions_differ(evaluations, tmp_path):
    root, ids, captions = evaluations
    run, edited = root / "evals" / "run", root / "evals" / "edited"
    out = tmp_path / "compare"
    done = report("--compare", run, edited, "--out", out, "--resamples", "50")
    assert f"-> {out / 'compare.json'}, {out / 'compare.md'}, {out / 'index.html'}" in \
        done.output
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "</script><b>" not in page.split('id="page-data">')[1].split("</script>")[0]
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing from a network
    (view,) = page_data(out / "index.html")["views"]
    assert view["sides"] == ["soft (XE)", "edited"] and view["value"] == "CIDEr"
    rows = view["rows"]
    assert sorted(r["id"] for r in rows) == sorted(ids[1:3])  # the two rewritten, no other
    k = view["values"].index("CIDEr")
    gains = [r["v"][k][0] - r["v"][k][1] for r in rows]
    assert gains == sorted(gains, reverse=True)  # A's largest wins first
    statistics = json.loads((run / "image_statistics.json").read_text())
    for row in rows:
        assert row["c"][1] == [EDITED]
        assert row["c"][0][0] == captions[row["id"]] and len(row["c"][0]) == 2  # both ranks
        own = statistics["metrics"]["cider"][statistics["image_ids"].index(row["id"])][0]
        assert row["v"][k][0] == pytest.approx(own, abs=1e-4)  # the image's own CIDEr-D
        words_a, words_b = word_diff(row["c"][0][0], EDITED)
        assert row["m"] == [words_a, words_b] and row["r"]  # the prepared references
        with Image.open(out / row["t"]) as thumbnail:  # the run knows its images
            assert max(thumbnail.size) <= 240 and thumbnail.format == "JPEG"
    pictured = [r for r in rows if r.get("a")]
    for row in pictured:
        assert row["a"][1] is None and (out / row["a"][0]).is_file()
    assert len(pictured) == len({ids[0], ids[1]} & {r["id"] for r in rows})  # figures=2
    assert "2 of 4 images have other captions" in view["note"]


def test_the_report_page_shows_the_table_the_curves_and_one_evaluations_captions(
        evaluations, tmp_path):
    root, ids, captions = evaluations
    run, edited = root / "evals" / "run", root / "evals" / "edited"
    out = tmp_path / "report"
    done = report(run, edited, "--out", out)
    assert f"-> {out / 'metrics.csv'}, {out / 'metrics.md'}, {out / 'index.html'}" in \
        done.output
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "<th>Approach</th>" in page and ">soft<" in page and ">edited<" in page
    assert (out / "curves" / "1-run.png").is_file() and 'src="curves/1-run.png"' in page
    (view,) = page_data(out / "index.html")["views"]
    assert view["sides"] == ["soft (XE)"] and len(view["rows"]) == len(ids)
    assert all(len(r["c"][0]) == 2 and r["t"] for r in view["rows"])  # n-best, thumbnails
    report(run, edited, "--out", out, "--gallery", edited)
    (view,) = page_data(out / "index.html")["views"]
    assert view["sides"] == ["edited"] and "No thumbnails: " in view["note"]
    assert {r["id"]: r["c"][0] for r in view["rows"]} == {
        i: [EDITED if k in (1, 2) else captions[i]] for k, i in enumerate(ids)}


def test_the_figure_draws_the_first_k_images_as_ranked_or_those_named(evaluations, tmp_path):
    root, ids, _ = evaluations
    run, edited = root / "evals" / "run", root / "evals" / "edited"
    done = report("--compare", run, edited, "--out", tmp_path / "f", "--figure", "2",
                  "--resamples", "10")
    assert f"-> {tmp_path / 'f' / 'figure.png'}, {tmp_path / 'f' / 'figure.pdf'}" in done.output
    with Image.open(tmp_path / "f" / "figure.png") as figure:
        two = figure.size
    assert two[0] > two[1] > 0
    assert (tmp_path / "f" / "figure.pdf").read_bytes().startswith(b"%PDF")
    report("--compare", run, edited, "--out", tmp_path / "g", "--images",
           ",".join(map(str, ids)), "--resamples", "10")
    with Image.open(tmp_path / "g" / "figure.png") as figure:
        assert figure.size[0] > two[0]  # four images: a wider grid
    refused = report("--compare", run, edited, "--out", tmp_path / "h", "--images", "987654",
                     ok=False)
    assert refused.exit_code == 1 and "--images: 987654: not captioned by both" in \
        refused.output
    for args, message in ((["--figure", "2"], "add --compare A B"),
                          (["--compare", run, edited, "--figure", "3", "--images", "1,2"],
                           "2 images named; name 3"),
                          (["--compare", run, edited, "--images", "x"], "image ids by commas")):
        refused = report(run, *args, "--out", tmp_path / "r", ok=False)
        assert refused.exit_code == 2 and message in refused.output, refused.output


def test_pages_say_once_what_they_cannot_show(evaluations, tmp_path, no_java):
    """Two results files: no thumbnails, said once; a folder without captions: no rows, said."""
    root, _, _ = evaluations
    edited = root / "evals" / "edited"
    other = tmp_path / "other"
    (tmp_path / "o.json").write_text(json.dumps([
        {"image_id": r["image_id"], "caption": "a shape"}
        for r in json.loads((edited / "results_given.json").read_text())]))
    done = CliRunner().invoke(cli.main, ["evaluate", str(tmp_path / "o.json"), "--refs",
                                         str(root / "prepared" / "refs_test.json"), "--out",
                                         str(other)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    report("--compare", edited, other, "--out", tmp_path / "c", "--resamples", "10")
    page = (tmp_path / "c" / "index.html").read_text(encoding="utf-8")
    assert page.count("No thumbnails: neither evaluation says where its images are") == 1
    (other / "results_given.json").unlink()
    report("--compare", edited, other, "--out", tmp_path / "c", "--resamples", "10")
    page = (tmp_path / "c" / "index.html").read_text(encoding="utf-8")
    assert f"No rows: {other}: no captions (results_given.json not found)" in page
    assert page_data(tmp_path / "c" / "index.html")["views"][0]["rows"] == []


# -- in a browser ---------------------------------------------------------------------------------

def chromium_or_skip() -> None:
    from trainer.evaluation.page.browser import chromium

    if chromium() is None:
        pytest.skip("no Chromium: install Debian's chromium package (.ci/run does) to load the "
                    "page in a real browser")


def shown_ids(dom: str) -> list[int]:
    return [int(i) for i in re.findall(r'<article class="row" data-id="(\d+)"', dom)]


@pytest.mark.slow
def test_the_comparison_page_renders_searches_and_filters_in_chromium(evaluations, tmp_path):
    """Headless Chromium loads the page: the rows render in the ranked order, a search and the
    filter (read from the URL's #fragment) change which are shown, no console message; and a
    screenshot is written."""
    from trainer.evaluation.page.browser import load, screenshot

    chromium_or_skip()
    root = evaluations[0]
    out = tmp_path / "compare"
    report("--compare", root / "evals" / "run", root / "evals" / "edited", "--out", out,
           "--resamples", "50")
    url = (out / "index.html").as_uri()
    (view,) = page_data(out / "index.html")["views"]
    ranked = [r["id"] for r in view["rows"]]
    k = view["values"].index("CIDEr")
    ahead = [r["id"] for r in view["rows"] if r["v"][k][0] > r["v"][k][1]]
    profile = tmp_path / "profile"

    page = load(url, profile)
    assert page.console == []
    assert shown_ids(page.dom) == ranked and page.attribute("data-matching") == "2"
    assert float(page.attribute("data-render-ms") or "nan") > 0
    assert "<mark>purple</mark>" in page.dom and "&lt;/script&gt;&lt;b&gt;" in page.dom
    assert len(re.findall(r'<img class="thumb" loading="lazy" src="thumbnails/', page.dom)) == 2

    flipped = load(url + "#flip=1", profile)
    assert shown_ids(flipped.dom) == ranked[::-1] and flipped.console == []
    assert shown_ids(load(url + "#q=Purple%20ELEPHANT", profile).dom) == ranked
    assert shown_ids(load(url + "#q=elephant&filter=a", profile).dom) == ahead
    assert shown_ids(load(url + "#filter=b", profile).dom) == [i for i in ranked
                                                                if i not in ahead]
    assert shown_ids(load(url + "#q=nosuchword", profile).dom) == []
    shot = screenshot(url, tmp_path / "compare.png", profile)
    with Image.open(shot) as image:
        assert image.size == (1200, 900) and np.asarray(image).std() > 0
