"""CIDEr-D rewards: capstack's vectorised scorer against pycocoevalcap's, same captions, one run.

By default N shapes scenes are drawn (5 references each, the demo's grammar) and
each gets a candidate: another caption of its own scene, one of another scene,
or a corrupted one (repeats, truncation, empty). With ``--refs`` (COCO caption
annotations) and ``--cands`` (COCO results) those files are scored instead;
document frequencies come from the references in both modes, as pycocoevalcap
computes them. Printed: both timings, ``max_abs_diff: X`` and ``speedup: Y``,
then the time of one SCST-sized batch (250 sampled captions of 50 images).

    python benchmarks/cider_reward.py [--n 1000] [--refs REFS.json --cands CANDS.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import common  # this checkout importable  # noqa: F401

from pycocoevalcap.cider.cider import Cider

from pipeline.demo.shapes.captions import captions_for
from pipeline.demo.shapes.scene import sample_scene
from trainer.scoring.references import load_references, load_results
from trainer.scoring.text import simple_tokenize
from trainer.rewards.cider import CiderD


def drawn(n: int, seed: int = 0) -> tuple[dict[int, list[str]], dict[int, str]]:
    rng = np.random.default_rng(seed)
    refs = {i: [simple_tokenize(c) for c in captions_for(sample_scene(rng, 128), rng, 6)]
            for i in range(n)}
    cands = {}
    for i in range(n):
        kind = i % 4
        own, other = refs[i][5], refs[(i + 1) % n][0]
        words = (own if kind == 0 else other if kind == 1 else own).split()
        if kind == 2:
            words = words[: rng.integers(0, len(words) + 1)]
        if kind == 3:
            words = words + words[-2:] * 3
        cands[i] = " ".join(words)
        refs[i] = refs[i][:5]
    return refs, cands


def as_tokens(cands: dict[int, str], words: list[str], ids: list[int]):
    index = {w: k for k, w in enumerate(words)}
    rows = [[index.get(w, 3) for w in cands[i].split()] for i in ids]
    lengths = np.array([len(r) for r in rows])
    tokens = np.zeros((len(rows), max(lengths.max(initial=0), 1)), np.int64)
    for k, r in enumerate(rows):
        tokens[k, :len(r)] = r
    return tokens, lengths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--refs", type=Path)
    ap.add_argument("--cands", type=Path)
    args = ap.parse_args(argv)
    if args.refs and args.cands:
        refs = {i: [simple_tokenize(c) for c in cs] for i, cs in load_references(args.refs).items()}
        cands = {i: simple_tokenize(c) for i, c in load_results(args.cands).items()}
        refs = {i: refs[i] for i in cands}
    else:
        refs, cands = drawn(args.n)
    ids = sorted(cands)
    # the captioning vocabulary: every candidate word (what a decoder could emit)
    vocab = (["<pad>", "<bos>", "<eos>", "<unk>"]
             + sorted({w for c in cands.values() for w in c.split()}))
    started = time.perf_counter()
    scorer = CiderD.from_references(refs, vocab)
    build = time.perf_counter() - started
    tokens, lengths = as_tokens(cands, scorer.words, ids)
    scorer.score(ids, tokens, lengths)  # warm-up
    started = time.perf_counter()
    ours = scorer.score(ids, tokens, lengths)
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    _, theirs = Cider().compute_score(refs, {i: [cands[i]] for i in ids})
    theirs_s = time.perf_counter() - started
    print(f"{len(ids)} captions, {sum(len(r) for r in refs.values())} references")
    print(f"reference cache built once in {build * 1000:.1f} ms")
    print(f"capstack CiderD: {ours_s * 1000:.2f} ms; "
          f"pycocoevalcap CiderD: {theirs_s * 1000:.1f} ms")
    print(f"max_abs_diff: {np.abs(ours - np.asarray(theirs)).max():.3g}")
    print(f"speedup: {theirs_s / ours_s:.1f}")
    rng = np.random.default_rng(1)
    images = min(50, len(ids))  # 50 images x 5 samples, as SCST draws them
    batch_ids = np.repeat(np.array(ids[:images]), 5)
    sampled = rng.integers(4, len(vocab), (images * 5, 16))
    lengths = rng.integers(4, 17, images * 5)
    started = time.perf_counter()
    for _ in range(20):
        scorer.score(batch_ids, sampled, lengths)
    print(f"SCST-sized batch ({images * 5} sampled captions, {images} images): "
          f"{(time.perf_counter() - started) / 20 * 1000:.2f} ms")


if __name__ == "__main__":
    main()
