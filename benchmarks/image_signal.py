"""How much a trained decoder reads its image: an RL start that ignores the image cannot be lifted.

    python benchmarks/image_signal.py runs/show_tell/best.pt runs/top_down/best.pt [--split val]

For each checkpoint, on a split's images (their features as the run read them):

- ``distinct``: how many different greedy captions the images get (1 of 100: the same caption
  for every image);
- ``nats/word``: the cross-entropy of the split's reference captions under teacher forcing,
  with each caption's own image, and with every caption given another image of the split (the
  images rolled by one);
- ``image worth``: the second minus the first, in nats per word: what the image tells the
  decoder about its captions. Near 0, the decoder is a language model of the captions.

SCST and C2F reinforce sampled captions by their reward against the greedy one; when the greedy
caption is one sentence for every image, there is little for them to reinforce but another
sentence for every image (docs/rl.md).
"""

from __future__ import annotations

import argparse
import sys

import torch

import common  # this checkout importable  # noqa: F401

from pipeline.captions.prepared import load_captions
from trainer.checkpoint import load_checkpoint
from trainer.data import Features, TrainBatches, batches_of
from trainer.decoders.base import Decoder
from trainer.evaluation.evaluate import load_model
from trainer.evaluation.predict import predict
from trainer.objectives.token_cross_entropy import output_cross_entropy

CAPTIONS_PER_IMAGE = 5


@torch.no_grad()
def nats_per_word(model: Decoder, feats: torch.Tensor, mask: torch.Tensor,
                  captions: torch.Tensor) -> float:
    """Teacher-forced cross-entropy of ``captions`` (CAPTIONS_PER_IMAGE adjacent rows per image)."""
    captions = captions[:, :int((captions != 0).sum(1).max())]
    targets = captions[:, 1:]
    output = model(model.encode(feats.float(), mask), captions)
    return float(output_cross_entropy(output, targets)) / int((targets != 0).sum())


def image_signal(checkpoint: str, split: str) -> dict:
    ckpt = load_checkpoint(checkpoint)
    model, vocab, config = load_model(ckpt)
    captions = load_captions(config.data.captions)
    features = Features(config.data.features, config.data.max_regions, config.data.box_geometry)
    batches = TrainBatches(captions, features, batch_size=len(captions.rows(split)),
                           seq_per_img=CAPTIONS_PER_IMAGE, seed=0, split=split)
    batch = next(batches.epoch(0))
    own = nats_per_word(model, batch.feats, batch.mask, batch.captions)
    other = nats_per_word(model, batch.feats.roll(1, 0), batch.mask.roll(1, 0), batch.captions)
    preds = predict(model, vocab, batches_of(features, batch.image_ids, 100), torch.device("cpu"),
                    beam_size=1, max_len=config.eval.max_len)
    distinct = len({" ".join(p.words) for p in preds})
    return {"checkpoint": checkpoint, "images": len(preds), "distinct": distinct,
            "own": own, "other": other}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--split", default="val")
    args = ap.parse_args(argv)
    print(f"{'checkpoint':<44} {'distinct':>9} {'nats/word':>10} {'other image':>12} "
          f"{'image worth':>12}")
    for path in args.checkpoints:
        r = image_signal(path, args.split)
        print(f"{path:<44} {r['distinct']:>4} / {r['images']:<3} {r['own']:>10.3f} "
              f"{r['other']:>12.3f} {r['other'] - r['own']:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
