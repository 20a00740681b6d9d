"""What SCST raises against what evaluation reads: the rewards of sampled captions and of the
greedy decode of the same checkpoints.

    python benchmarks/samples_and_decodes.py runs/top_down/best.pt runs/top_down-rl/best.pt \
        [--split train] [--samples 5] [--cider-cache data/cider/train.npz]

For each checkpoint, on a split's images (their features as the run read them): CIDEr-D and
BLEU-4 (the rewards' per-image scores, against the split's references) and the length in words,
each the mean over

- ``samples``: ``--samples`` captions per image drawn as SCST draws them (training mode, so with
  the run's dropout; temperature 1), the captions whose expected reward the policy gradient
  raises;
- ``greedy``: the greedy decode (evaluation mode), which validation scores and beam search
  approximates.

SCST moves the first; the tables report the second. When a reward lifts its samples and lowers
its decodes (docs/rl.md: the mixed reward), this prints both.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import common  # this checkout importable  # noqa: F401

from pipeline.captions.prepared import load_captions
from trainer.checkpoint import load_checkpoint
from trainer.data import Features, TrainBatches
from trainer.decode import sample
from trainer.evaluation.loaded import load_model
from trainer.objectives.scst import greedy_decode, words_and_lengths
from trainer.rewards.base import tokenized_references
from trainer.rewards.bleu import Bleu, BleuConfig
from trainer.rewards.cider import CiderD

BATCH = 100


def scored(rewards: dict, image_ids, tokens: torch.Tensor) -> dict[str, np.ndarray]:
    words, lengths = words_and_lengths(tokens)
    return {**{name: r.score(image_ids, words, lengths) for name, r in rewards.items()},
            "length": lengths.astype(np.float64)}


@torch.no_grad()
def samples_and_decodes(checkpoint: str, split: str, samples: int, cider_cache: str,
                        seed: int = 0) -> dict[str, dict[str, float]]:
    """{"samples": {...}, "greedy": {...}}: each the mean CIDEr-D, BLEU-4 and length."""
    torch.manual_seed(seed)
    model, vocab, config = load_model(load_checkpoint(checkpoint))
    captions = load_captions(config.data.captions)
    words = [vocab.itow[i] for i in range(len(vocab.itow))]
    rewards = {"CIDEr-D": CiderD.load(cider_cache),
               "BLEU-4": Bleu.from_references(BleuConfig(n=4),
                                              tokenized_references(captions, split), words)}
    features = Features(config.data.features, config.data.max_regions, config.data.box_geometry)
    batches = TrainBatches(captions, features, batch_size=BATCH, seq_per_img=1, seed=seed,
                           split=split)
    found: dict[str, list[dict]] = {"samples": [], "greedy": []}
    max_len = config.train.max_len  # what SCST samples and validation decodes
    for batch in batches.epoch(0):  # first, while the checkpoint's BatchNorm is as saved
        found["greedy"].append(scored(rewards, batch.image_ids, greedy_decode(
            model, batch.feats.float(), batch.mask, max_len)))
    model.train()  # as SCST draws: the run's dropout on (and batch norm on each batch)
    for batch in batches.epoch(0):
        drawn = sample(model, model.encode(batch.feats.float(), batch.mask), max_len, 1.0,
                       n=samples)
        found["samples"].append(scored(rewards, np.repeat(np.asarray(batch.image_ids), samples),
                                       drawn.tokens))
    return {kind: {key: float(np.concatenate([part[key] for part in parts]).mean())
                   for key in parts[0]} for kind, parts in found.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--split", default="train", choices=["train", "val", "test"])
    ap.add_argument("--samples", type=int, default=5, help="sampled captions per image")
    ap.add_argument("--cider-cache", default="data/cider/train.npz",
                    help="the cider_df stage's cache (CIDEr-D's document frequencies)")
    args = ap.parse_args(argv)
    print(f"{args.split} images; samples: {args.samples} per image, training mode, "
          f"temperature 1; greedy: evaluation mode")
    print(f"{'checkpoint':<40} {'samples: CIDEr-D':>17} {'BLEU-4':>7} {'words':>6}   "
          f"{'greedy: CIDEr-D':>16} {'BLEU-4':>7} {'words':>6}")
    for path in args.checkpoints:
        r = samples_and_decodes(path, args.split, args.samples, args.cider_cache)
        s, g = r["samples"], r["greedy"]
        print(f"{path:<40} {s['CIDEr-D']:>17.3f} {s['BLEU-4']:>7.3f} {s['length']:>6.2f}   "
              f"{g['CIDEr-D']:>16.3f} {g['BLEU-4']:>7.3f} {g['length']:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
