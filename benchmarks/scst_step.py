"""SCST step time at the papers' setting, split into sampling, reward and backward.

`top_down` with hidden 512, vocabulary 9,487, 36x2048 regions, 50 images x 5
sampled captions of at most 16 words plus the 50 greedy decodes of the
baseline; rewards from the cached CIDEr-D of synthetic references (5 per
image). The time of a step is split as the trainer logs it.

    python benchmarks/scst_step.py [--steps 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import common  # this checkout importable  # noqa: F401

import torch

from trainer.batch import TrainBatch, whole_batch
from trainer.decoders import build_decoder
from trainer.decoders.top_down import TopDownConfig
from trainer.objectives import Setting, StepKey
from trainer.objectives.scst import SelfCritical, SelfCriticalConfig
from trainer.rewards.cider import CiderD

VOCAB = 9487


def synthetic_scorer(images: int, rng) -> CiderD:
    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    frequent = rng.zipf(1.3, size=200_000) % (VOCAB - 4) + 4  # a long-tailed word distribution
    refs, k = {}, 0
    for image in range(images):
        captions = []
        for _ in range(5):
            n = int(rng.integers(8, 16))
            captions.append(" ".join(words[w] for w in frequent[k:k + n]))
            k += n
        refs[image] = captions
    return CiderD.from_references(refs, words)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--images", type=int, default=50, help="images a step (5 samples each)")
    ap.add_argument("--hidden", type=int, default=512, help="the decoder's widths")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    n, width = args.images, args.hidden
    scorer = synthetic_scorer(n, rng)
    torch.manual_seed(0)
    model = build_decoder("top_down", TopDownConfig(hidden=width, embed=width, att_hidden=width),
                          VOCAB, 2048).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-5)
    feats = torch.randn(n, 36, 2048, device=device).abs()
    mask = torch.ones(n, 36, dtype=torch.bool, device=device)
    rl = SelfCritical(SelfCriticalConfig(reward=None, samples=5, baseline="greedy"),
                      Setting(captions=None, max_len=16, device=device), scorer=scorer)
    batch = TrainBatch(list(range(n)), feats, mask, torch.zeros(n * 5, 18, dtype=torch.long),
                       whole_batch(tokens=n * 5 * 17, captions=n * 5, images=n), seq_per_img=5)
    print(f"device: {device} ({torch.get_num_threads()} threads); top_down hidden {width}, "
          f"vocab {VOCAB}, 36x2048 regions, {n} images x 5 samples + {n} greedy, max length 16")
    rows = []
    for step in range(args.steps + 1):
        started = time.perf_counter()
        loss, stats = rl.loss(model, batch, StepKey(0, 0, step))
        backward_started = time.perf_counter()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - started
        if step:  # the first step warms up
            rows.append((total, stats["time_sample"], stats["time_reward"],
                         time.perf_counter() - backward_started))
    total, sampling, reward, backward = np.mean(rows, 0)
    print(f"step {total:.2f} s: sampling + greedy {sampling:.2f} s ({sampling / total:.0%}), "
          f"reward {reward * 1000:.1f} ms ({reward / total:.1%}), backward + Adam {backward:.2f} s "
          f"({backward / total:.0%})")


if __name__ == "__main__":
    main()
