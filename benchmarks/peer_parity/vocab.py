"""``capstack prepare --vocab-rule rtl`` beside self-critical.pytorch's ``prepro_labels.py``.

The peer's own script runs (a subprocess of this interpreter: ``h5py``, ``torch``,
``torchvision`` and ``scikit-image``, which it imports, must be importable) on a
Karpathy json, and ``prepare_captions(..., vocab_rule="rtl")`` on the same json, at
the same threshold and ``--max-len 16``. Compared, each to be equal:

- the vocabulary: the peer's ``ix_to_word`` (1-indexed; its ``UNK`` last when some word
  fell under the threshold) against capstack's words after its four special tokens;
- the labels: the peer's ``labels`` [M, 16] against capstack's, each capstack id mapped
  to the peer's index of the same word (``<unk>`` to its ``UNK``): truncation included;
- the lengths, and each image's caption rows (the peer's 1-indexed inclusive
  ``label_start_ix``/``label_end_ix``).

The json is drawn here: 150 images in the Karpathy splits (train, restval, val, test),
five captions each, words from a Zipf law over 400 so that thresholds bite, some
captions longer than 16 words. A second json from ``--karpathy FILE`` runs too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from benchmarks.peer_parity import Difference

from pipeline.captions.prepare import prepare_captions
from pipeline.captions.vocab import UNK_ID, Vocabulary

THRESHOLDS = (2, 5)
MAX_LEN = 16
SPLITS = ("train", "restval", "val", "test")


def drawn_karpathy_json(path: Path, images: int = 150, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(400)]
    entries, sentid = [], 0
    for i in range(images):
        sentences = []
        for _ in range(5):
            length = int(rng.integers(3, 22))  # over 16 words sometimes: truncated
            tokens = [words[min(int(rng.zipf(1.4)) - 1, len(words) - 1)] for _ in range(length)]
            sentences.append({"tokens": tokens, "raw": " ".join(tokens), "imgid": i,
                              "sentid": sentid})
            sentid += 1
        entries.append({"filepath": "images", "filename": f"{i}.jpg", "imgid": i,
                        "cocoid": 1000 + i, "split": SPLITS[i % len(SPLITS)],
                        "sentids": [s["sentid"] for s in sentences], "sentences": sentences})
    path.write_text(json.dumps({"dataset": "drawn", "images": entries}))
    return path


def run_peer(peer: Path, dataset_json: Path, threshold: int, out: Path) -> tuple[list[str], dict]:
    """The peer's script on ``dataset_json``: its words by index, its label arrays."""
    done = subprocess.run(
        [sys.executable, str(peer / "scripts" / "prepro_labels.py"), "--input_json",
         str(dataset_json), "--output_json", str(out / "peer.json"), "--output_h5",
         str(out / "peer"), "--max_length", str(MAX_LEN), "--word_count_threshold",
         str(threshold)], capture_output=True, text=True, cwd=out)
    if done.returncode != 0:
        raise SystemExit(f"{peer}/scripts/prepro_labels.py failed (exit {done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    ix_to_word = json.loads((out / "peer.json").read_text())["ix_to_word"]
    words = [ix_to_word[str(i)] for i in range(1, len(ix_to_word) + 1)]
    with h5py.File(out / "peer_label.h5", "r") as f:
        arrays = {k: f[k][()].astype(np.int64) for k in f}
    return words, arrays


def run_capstack(dataset_json: Path, threshold: int, out: Path) -> tuple[Vocabulary, dict]:
    prepare_captions(dataset_json, out / "capstack", min_count=threshold, max_len=MAX_LEN,
                     vocab_rule="rtl")
    with h5py.File(out / "capstack" / "captions.h5", "r") as f:
        arrays = {k: f[k][()].astype(np.int64) for k in ("labels", "lengths", "label_start",
                                                         "label_end")}
    return Vocabulary.load(out / "capstack" / "vocab.json"), arrays


def as_peer_ids(labels: np.ndarray, vocab: Vocabulary, peer_words: list[str]) -> np.ndarray:
    """capstack's ids as the peer's indices of the same words (0 stays padding)."""
    index = {w: i + 1 for i, w in enumerate(peer_words)}
    table = np.zeros(len(vocab), np.int64)
    for i, word in enumerate(vocab.itow[UNK_ID + 1:], start=UNK_ID + 1):
        table[i] = index.get(word, -1)  # -1: a word the peer does not have
    table[UNK_ID] = index.get("UNK", -1)
    return table[labels]


def compare(label: str, peer_words, peer, vocab, ours) -> list[Difference]:
    has_unk = bool(peer_words) and peer_words[-1] == "UNK"
    peer_vocab = peer_words[:-1] if has_unk else peer_words
    our_vocab = vocab.itow[UNK_ID + 1:]
    word_diff = sum(a != b for a, b in zip(peer_vocab, our_vocab)) + abs(len(peer_vocab) -
                                                                       len(our_vocab))
    labels = as_peer_ids(ours["labels"], vocab, peer_words)
    same_shape = labels.shape == peer["labels"].shape
    label_diff = int((labels != peer["labels"]).sum()) if same_shape else labels.size
    starts = ours["label_start"] + 1, ours["label_end"]  # 1-indexed, inclusive
    ranges = int((starts[0] != peer["label_start_ix"]).sum() + (starts[1] != peer["label_end_ix"])
                 .sum()) if len(starts[0]) == len(peer["label_start_ix"]) else len(starts[0])
    note = f"{len(peer_vocab)} words + UNK" if has_unk else f"{len(peer_vocab)} words"
    return [
        Difference("vocab", f"{label}: ix_to_word entries that differ", word_diff, 0, note),
        Difference("vocab", f"{label}: label entries that differ ({labels.size} entries)",
                   label_diff, 0),
        Difference("vocab", f"{label}: label lengths that differ",
                   int((ours["lengths"] != peer["label_length"]).sum()), 0),
        Difference("vocab", f"{label}: image caption ranges that differ", ranges, 0),
    ]


def check(peer_dir: Path, options) -> list[Difference]:
    """``options.karpathy``: more Karpathy jsons to compare on (a real dataset_coco.json)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jsons = [drawn_karpathy_json(Path(tmp) / "drawn.json"), *options.karpathy]
        for dataset_json in jsons:
            for threshold in THRESHOLDS:
                out = Path(tmp) / f"{dataset_json.stem}-{threshold}"
                out.mkdir()
                peer_words, peer = run_peer(peer_dir, dataset_json, threshold, out)
                vocab, ours = run_capstack(dataset_json, threshold, out)
                rows += compare(f"{dataset_json.name}, threshold {threshold}", peer_words, peer,
                                vocab, ours)
    return rows
