"""Images per second of each decoding option, beside plain beam search, on the CPU.

A random-weight top_down (trainer/decoders/top_down.py) at small sizes: 36 regions of 512-d,
embed, hidden and attention 256, a vocabulary of 2,000, captions of up to 16 words. Random
weights rarely end a caption early, so every search runs its full 17 steps: the figures are
the searches' cost, not a trained model's (which ends sooner). Each option decodes the same
batch of images (all at once: every search is batched over the images, its Python loops run
over steps, groups or ensemble members, never over images), ``--repeats`` times; the fastest
run is kept. The options:

- greedy; beam 5 (trainer/decode.py's own search);
- beam 5 + wu_0.2, diverse 2x3 (2 groups of 3 beams), top-p 0.9 with 5 samples per image,
  beam 5 with trigram blocking (trainer/decoding_options.py's general searches);
- an ensemble of two top_downs (trainer/ensemble.py) under beam 5.

    python benchmarks/decoding.py [--images 50] [--repeats 3] [--threads 1]

A row: the option, images/s, and its time as a multiple of plain beam 5's.
"""

from __future__ import annotations

import argparse
import time

import common  # this checkout importable  # noqa: F401

SIZES = {"embed": 256, "hidden": 256, "att_hidden": 256, "dropout": 0.0}
VOCAB, REGIONS, FEATURE_DIM, MAX_LEN = 2000, 36, 512, 16


def options() -> dict:
    """Each benchmarked option: (its name, whether it decodes with the ensemble, its config)."""
    from trainer.decoding_options import DecodingConfig

    def beam(**more) -> DecodingConfig:
        return DecodingConfig(beam_size=5, max_len=MAX_LEN, **more)

    return {
        "greedy": (False, DecodingConfig(beam_size=1, max_len=MAX_LEN)),
        "beam 5": (False, beam()),
        "beam 5 + wu_0.2": (False, beam(length_penalty="wu_0.2")),
        "diverse 2x3": (False, DecodingConfig(search="diverse", beam_size=6, group_size=2,
                                              max_len=MAX_LEN)),
        "top-p 0.9, n 5": (False, DecodingConfig(search="greedy", sample_method="sample",
                                                 top_p=0.9, n=5, max_len=MAX_LEN)),
        "beam 5 + trigram blocking": (False, beam(block_trigrams=True)),
        "ensemble of two, beam 5": (True, beam()),
    }


def top_down(seed: int):
    import torch

    from trainer.decoders import DECODERS, build_decoder

    torch.manual_seed(seed)
    config = DECODERS.get("top_down").Config(**SIZES)
    return build_decoder("top_down", config, VOCAB, FEATURE_DIM).eval()


def images_per_second(model, feats, mask, config, repeats: int) -> float:
    """The fastest of ``repeats`` decodings of the batch, as images per second."""
    import torch

    from trainer.decoding_options import decode

    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            decode(model, model.encode(feats, mask), config)
            best = min(best, time.perf_counter() - start)
    return feats.shape[0] / best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from trainer.ensemble import Ensemble

    torch.set_num_threads(args.threads)
    single = top_down(0)
    pair = Ensemble([single, top_down(1)]).eval()
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(args.images, REGIONS, FEATURE_DIM, generator=g)
    mask = torch.ones(args.images, REGIONS, dtype=torch.bool)
    print(f"top_down {SIZES['hidden']} hidden, vocabulary {VOCAB}, {REGIONS} regions x "
          f"{FEATURE_DIM}, {args.images} images, up to {MAX_LEN} words, {args.threads} "
          f"thread(s), best of {args.repeats}")
    rates = {}
    for name, (ensembled, config) in options().items():
        torch.manual_seed(0)
        rates[name] = images_per_second(pair if ensembled else single, feats, mask, config,
                                        args.repeats)
    plain = rates["beam 5"]
    width = max(map(len, rates))
    print(f"{'option':<{width}}  images/s  time vs beam 5")
    for name, rate in rates.items():
        print(f"{name:<{width}}  {rate:8.1f}  {plain / rate:13.2f}x")


if __name__ == "__main__":
    main()
