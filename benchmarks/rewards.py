"""BLEU-4 and ROUGE-L rewards: capstack's vectorised scorers against pycocoevalcap's, and METEOR.

The captions are benchmarks/cider_reward.py's: N drawn shapes scenes, 5
references each, and a candidate per scene (another caption of its own scene,
one of another scene, a truncated one, one with repeats). The references are
prepared once, as when a reward is built; each side then scores the N
candidates. Printed per metric: both timings, ``max_abs_diff: X`` against
pycocoevalcap's per-image scores and ``speedup: Y``. Then METEOR: the start of
its Java scorer, kept for the run, and its cost per caption on an SCST-sized
batch (``--meteor`` captions; skipped without java).

    python benchmarks/rewards.py [--n 2000] [--meteor 250]
"""

from __future__ import annotations

import argparse
import shutil
import time

import numpy as np

from common import timed

from cider_reward import as_tokens, drawn
from pycocoevalcap.bleu.bleu import Bleu as CocoBleu
from pycocoevalcap.rouge.rouge import Rouge as CocoRouge

from trainer.rewards.bleu import Bleu, BleuConfig
from trainer.rewards.meteor import Meteor, MeteorConfig
from trainer.rewards.rouge import RougeL, RougeLConfig


def compare(label: str, reward, theirs, refs, cands, ids) -> None:
    tokens, lengths = as_tokens(cands, reward.references.words, ids)
    reward.score(ids, tokens, lengths)  # warm-up
    ours_s, ours = timed(lambda: reward.score(ids, tokens, lengths))
    theirs_s, expected = timed(lambda: theirs(refs, {i: [cands[i]] for i in ids}))
    print(f"{label}: capstack {ours_s * 1000:.2f} ms; pycocoevalcap {theirs_s * 1000:.1f} ms")
    print(f"{label} max_abs_diff: {np.abs(ours - np.asarray(expected)).max():.3g}")
    print(f"{label} speedup: {theirs_s / ours_s:.1f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="drawn captions (and scenes)")
    ap.add_argument("--meteor", type=int, default=250, help="captions of METEOR's timed batch")
    args = ap.parse_args(argv)
    refs, cands = drawn(args.n)
    ids = sorted(cands)
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>"] + sorted({w for c in cands.values()
                                                           for w in c.split()})
    print(f"{len(ids)} captions, {sum(len(r) for r in refs.values())} references")
    build_s, bleu = timed(lambda: Bleu.from_references(BleuConfig(n=4), refs, vocab))
    print(f"BLEU-4: references prepared once in {build_s * 1000:.1f} ms")
    compare("BLEU-4", bleu, lambda g, r: CocoBleu(4).compute_score(g, r, verbose=0)[1][3],
            refs, cands, ids)
    build_s, rouge = timed(lambda: RougeL.from_references(RougeLConfig(), refs, vocab))
    print(f"ROUGE-L: references prepared once in {build_s * 1000:.1f} ms")
    compare("ROUGE-L", rouge, lambda g, r: CocoRouge().compute_score(g, r)[1], refs, cands, ids)
    if shutil.which("java") is None or args.meteor == 0:
        print("METEOR: skipped (" + ("--meteor 0" if args.meteor == 0 else "java not found") + ")")
        return
    batch = ids[:args.meteor]
    tokens, lengths = as_tokens(cands, vocab, batch)
    started = time.perf_counter()
    meteor = Meteor.from_references(MeteorConfig(), refs, vocab)
    try:
        meteor.score(batch[:1], tokens[:1], lengths[:1])  # the JVM and its tables load first
        start_s = time.perf_counter() - started
        score_s, _ = timed(lambda: meteor.score(batch, tokens, lengths))
    finally:
        meteor.close()
    print(f"METEOR: Java scorer started once in {start_s:.1f} s (kept for the run); "
          f"{len(batch)} captions in {score_s * 1000:.0f} ms: "
          f"{score_s / len(batch) * 1000:.2f} ms per caption")


if __name__ == "__main__":
    main()
