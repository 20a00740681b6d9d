"""Text that capstack hands to Java or to a line-based format keeps one row per line (issue 31,
item 2), and caption words that look like the vocabulary's special tokens stay words (item 11).

Each test is the repro of one place: what came out once it had a line breaker (or a ``|||``, or an
``<eos>``) in it, asserted on the real output: the PTB tokenizer, METEOR's stdin, the report's
metrics.csv / metrics.md, the butd-tsv export, prepare's captions.h5.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from cli import main
from conftest import karpathy_image
from pipeline.captions.prepare import prepare_captions
from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, Vocabulary
from pipeline.features.interchange.exporter import export_features
from pipeline.features.stores import open_store
from trainer.evaluation import report as R
from trainer.scoring import metrics as M
from trainer.scoring import text as T
from trainer.scoring.metrics.base import Texts
from trainer.scoring.metrics.meteor import Meteor
from trainer_fixtures import write_feature_store

# every character Python's str.splitlines() or Java's readers end a line at, and METEOR's separator
BREAKERS = ["\r", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
            "\u2029", " ||| "]

needs_java = pytest.mark.skipif(T.java_missing() is not None,
                                reason="java: the PTB tokenizer and METEOR are what this guards")


# ---------------------------------------------------------------- A: PTB tokenizer and METEOR

@needs_java
def test_ptb_lines_out_are_checked_against_lines_in(monkeypatch):
    """pycocoevalcap's tokenizer pairs its output lines with captions by position and drops extra
    lines (zip), so the old count check (captions per image) missed a line breaker: the captions
    after it came back shifted, each under the previous caption's image. Repro with one_line()
    disabled, as if Java ended a line at a character capstack did not know of: before, 'ptb' with
    every caption after image 0 shifted; now the tokenizer's shift is caught (an end marker
    caption must come back last and whole) and the simple tokenizer scores instead."""
    monkeypatch.setattr(T, "one_line", lambda text: text)
    captions = {0: ["a red\rcircle"], 1: ["two blue squares"], 2: ["a green star"],
                3: ["one small ring"]}
    out, tokenizer = T.tokenize_any(captions)
    assert out == {0: ["a red circle"], 1: ["two blue squares"], 2: ["a green star"],
                   3: ["one small ring"]}
    assert tokenizer.startswith("simple (ptb failed: ") and "lines" in tokenizer


@needs_java
def test_ptb_keeps_one_line_per_caption_with_every_breaker():
    captions = {i: [f"a{b}red circle"] for i, b in enumerate(BREAKERS)}
    captions[len(BREAKERS)] = ["the last one"]
    out, tokenizer = T.tokenize(captions)
    assert tokenizer == "ptb"
    assert out == {**{i: ["a red circle"] for i in range(len(BREAKERS))},
                   len(BREAKERS): ["the last one"]}


@needs_java
def test_meteor_is_handed_one_line_per_caption_whatever_it_is_given():
    """METEOR reads ``SCORE ||| ref ||| ... ||| hypothesis`` lines on stdin. Handed text with a
    ``|||`` (one reference read as two) or a line break (the protocol out of step), METEOR gave
    0.576 instead of 1.0, or ``ValueError: could not convert string to float: b'2.0 2.0 ...'``
    (METEOR None). Now the METEOR metric puts every caption on one line itself, whatever calls
    it."""
    # every breaker in one corpus (one METEOR process): each image's pair of references and
    # hypothesis, one broken in a reference, the next in its hypothesis
    refs, res, broken_refs, broken_res = {}, {}, {}, {}
    for k, breaker in enumerate(BREAKERS):
        refs[2 * k], res[2 * k] = ["a red circle", "a circle"], ["a red circle"]
        refs[2 * k + 1] = ["two blue squares", "blue squares"]
        res[2 * k + 1] = ["two blue squares"]
        broken_refs[2 * k] = [f"a red{breaker}circle", "a circle"]
        broken_res[2 * k] = ["a red circle"]
        broken_refs[2 * k + 1] = refs[2 * k + 1]
        broken_res[2 * k + 1] = [f"two blue{breaker}squares"]
    clean = Meteor().compute(Texts(refs, res, {}))
    assert clean == [pytest.approx(1.0)]
    broken = Meteor().compute(Texts(broken_refs, broken_res, {}))
    assert broken == pytest.approx(clean), [repr(b) for b in BREAKERS]


@needs_java
def test_what_score_writes_to_meteor_stdin(monkeypatch):
    """The lines score() really writes to METEOR: one per image, each with its references'
    count of fields, no line breaker inside, from captions full of them."""
    from pycocoevalcap.meteor.meteor import Meteor

    sent = []
    real_stat = Meteor._stat

    def spy(self, hypothesis, references):
        sent.append(" ||| ".join(("SCORE", " ||| ".join(references),
                                  hypothesis.replace("|||", "").replace("  ", " "))))
        return real_stat(self, hypothesis, references)

    monkeypatch.setattr(Meteor, "_stat", spy)
    candidates = {i: f"a red{b}circle" for i, b in enumerate(BREAKERS)}
    references = {i: ["a red circle", f"a{b}circle", "red | circle"]
                  for i, b in enumerate(BREAKERS)}
    out = M.score(candidates, references, spice=False)
    assert out["tokenizer"] == "ptb" and out["metrics"]["METEOR"] == pytest.approx(1.0)
    assert len(sent) == len(BREAKERS)
    for line in sent:
        assert line.splitlines() == [line] and line.count("|||") == 1 + 3, repr(line)


# ---------------------------------------------------------------- A: the report's tables

def _metrics_file(path: Path, approach: str, training: str = "XE", **unavailable) -> Path:
    metrics = {name: 0.5 for name in M.value_names()}
    metrics.update({name: None for name in unavailable})
    path.write_text(json.dumps({"approach": approach, "training": training,
                                "family": "cross-entropy", "metrics": metrics,
                                "unavailable": unavailable}))
    return path


def test_report_rows_stay_one_line_each(tmp_path):
    """An approach name (or a reason) with a line breaker: metrics.csv held a quoted row over
    two lines, and metrics.md a table row broken in two (``_cell`` replaced ``\\n`` only), so a
    line-based reader saw a row more, and a markdown renderer a table that ends early. Now every
    text cell and note is put on one line (whitespace runs to one space); '|' stays as it was."""
    names = [f"soft{b}attention" for b in BREAKERS if b.strip() != "|||"] + ["Plain | grid"]
    files = [_metrics_file(tmp_path / f"m{i}.json", name, "XE" if "|" in b else f"X{b}E")
             for i, (name, b) in enumerate(zip(names, BREAKERS))]
    files.append(_metrics_file(tmp_path / "spice.json", "Up-Down",
                               SPICE="jar\r\nmissing\u2028here"))
    csv_path, md_path = R.write_report(files, tmp_path / "report")

    csv_lines = csv_path.read_text(encoding="utf-8").splitlines()
    assert len(csv_lines) == 1 + len(files)
    frame = pd.read_csv(csv_path)
    assert len(frame) == len(files)
    assert list(frame["Approach"]) == ["soft attention"] * (len(names) - 1) + ["Plain | grid",
                                                                               "Up-Down"]
    assert set(frame["Training"]) == {"X E", "XE"}

    md_lines = md_path.read_text(encoding="utf-8").splitlines()
    rows = [line for line in md_lines if line.startswith("| ")]
    assert len(rows) == 1 + len(files)  # header + one per file
    assert all(line.endswith(" |") and line.count(" | ") == len(R.columns()) - 1 for line in rows)
    assert "SPICE: n/a — jar missing here" in md_lines


# ---------------------------------------------------------------- A: butd-tsv export

def test_butd_tsv_export_is_one_line_per_record(tmp_path):
    """Proof that the TSV writer cannot be broken by a key: a store's ids are integers, and every
    other column an integer or base64 (``A-Za-z0-9+/=``), so no tab or line breaker can appear.
    Asserted on the real file: lines (by any reader's line ends) == records, six columns each."""
    ids = [7, 100, 2**40, 3]
    store = write_feature_store(tmp_path / "regions.lmdb", ids, kind="regions", dim=8)
    (out,) = export_features(store, "butd-tsv", tmp_path / "out.tsv", progress=False)
    data = out.read_bytes()
    assert data.endswith(b"\r\n") and data.count(b"\r\n") == len(ids)
    lines = data.decode("ascii").splitlines()
    assert len(lines) == len(ids)
    assert [line.split("\t")[0] for line in lines] == [str(i) for i in sorted(ids)]
    assert all(len(line.split("\t")) == 6 for line in lines)
    assert all(isinstance(i, (int, np.integer)) for i in open_store(store).ids())


# ---------------------------------------------------------------- B1: special tokens in captions

def test_special_tokens_in_a_caption_are_words_encoded_as_unk(tmp_path):
    """A caption whose tokens include '<eos>', '<pad>', '<bos>' or '<unk>': prepare encoded them
    as the special ids (2, 0, 1, 3), so '<eos>' ended the caption mid-way and '<pad>' padded it.
    Now every one of them is encoded as <unk> and counted in prepare's '-> <unk>' tokens."""
    images = [
        karpathy_image(0, "train", ["a <eos> dog runs", "a <pad> dog sits", "<bos> a dog <unk>"]),
        karpathy_image(1, "train", ["a dog runs", "a dog sits"]),
        karpathy_image(2, "val", ["a dog <eos>", "a dog"]),
        karpathy_image(3, "test", ["a dog", "<pad> dog"]),
    ]
    dataset = tmp_path / "dataset.json"
    dataset.write_text(json.dumps({"dataset": "t", "images": images}))
    summary = prepare_captions(dataset, tmp_path / "prepared", min_count=1)
    vocab = Vocabulary.load(tmp_path / "prepared" / "vocab.json")
    assert vocab.itow[:4] == list(SPECIALS) and len(set(vocab.itow)) == len(vocab.itow)
    assert not set(vocab.counts) & set(SPECIALS)
    with h5py.File(tmp_path / "prepared" / "captions.h5") as f:
        labels, lengths = f["labels"][:], f["lengths"][:]
    captions = [c for im in images for c in (s["tokens"] for s in im["sentences"])]
    for row, tokens in enumerate(captions):
        ids = labels[row, :lengths[row]].tolist()
        assert lengths[row] == len(tokens)
        assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids), (tokens, ids)
        assert [t for t, i in zip(tokens, ids) if i == UNK_ID] == \
            [t for t in tokens if t in SPECIALS], (tokens, ids)
    assert summary["unk_tokens"] == 4  # <eos>, <pad>, <bos>, <unk> of the train split
    assert vocab.encode(["a", "<eos>", "dog", "<pad>"]) == \
        [vocab.wtoi["a"], UNK_ID, vocab.wtoi["dog"], UNK_ID]


# ---------------------------------------------------------------- B3: prepare into '.'

def test_prepare_into_the_current_folder(tmp_path, monkeypatch):
    """'prepare ds.json .' once raised a traceback ('.' has an empty name). Now: '.' holding the
    json is the one-line refusal naming it; an empty '.' is written into."""
    images = [karpathy_image(0, "train", ["a red circle", "a circle"]),
              karpathy_image(1, "val", ["a star", "one star"]),
              karpathy_image(2, "test", ["a square", "one square"])]
    (tmp_path / "ds.json").write_text(json.dumps({"dataset": "t", "images": images}))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["prepare", "ds.json", "."])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.strip().splitlines() == [
        f"Error: {tmp_path}: the output folder holds the input ds.json; replacing the folder "
        "would delete it: choose another output folder"]
    assert (tmp_path / "ds.json").is_file()

    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    result = CliRunner().invoke(main, ["prepare", "../ds.json", ".", "--min-count", "1"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "empty" / "vocab.json").is_file()
    assert "prepare: .: vocabulary" in result.output


def test_a_dataset_token_holding_whitespace_is_split_into_words(tmp_path):
    """A token ``"a\\nb"`` was one vocabulary word, printed by `capstack caption` over two lines."""
    from pipeline.captions.karpathy import load_karpathy

    image = karpathy_image(0, "train", ["a dog"])
    image["sentences"][0]["tokens"] = ["a\nred", "dog\r", " ", "runs\u2028fast"]
    path = tmp_path / "dataset_x.json"
    path.write_text(json.dumps({"dataset": "x", "images": [image]}))
    (sentence,) = load_karpathy(path).images[0].sentences
    assert sentence.tokens == ("a", "red", "dog", "runs", "fast")
