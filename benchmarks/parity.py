"""Parity with the reference code, shown by running it: a peer's own code beside capstack's.

Give each peer as a checkout (fetch it; nothing of it is copied into capstack):

    python benchmarks/parity.py --peer DIR [--peer DIR ...]

Each peer is recognised by its files and runs the checks that need it
(benchmarks/peer_parity/); ``--check NAME`` (repeatable) runs those named only. Every row
prints what was compared, the largest difference seen and its bound; the script exits 1 if
any row is outside its bound. Rows without a bound are known differences, stated with their
size.

Peers and their checks:
- self-critical.pytorch (https://github.com/ruotianluo/self-critical.pytorch; its
  requirements ``six``, ``yacs`` and ``scikit-image`` importable):
  ``vocab``, ``capstack prepare --vocab-rule rtl`` against its ``scripts/prepro_labels.py``
  (``--karpathy FILE`` adds a json of yours, e.g. dataset_coco.json, to the drawn one);
  ``transformer``, capstack's Transformer decoder given the peer's TransformerModel weights;
  ``evaluation``, capstack's metrics against its ``eval_utils.language_eval`` on the same
  captions (its ``coco-caption`` submodule needed: clone with ``--recursive``);
  ``checkpoints``, ``capstack import-checkpoint rtl`` on UpDown and Transformer checkpoints its
  own code saved: teacher-forced log-probabilities, and greedy, beam, length-penalised,
  diverse, constrained and top-k/top-p decoding against its own; and its ``AttEnsemble`` of
  two Transformers, and of an UpDown and a Transformer, against capstack's ensemble of the
  imported runs (teacher forcing, greedy, beam 5).
- mmf (https://github.com/facebookresearch/mmf; ``requests``, ``filelock`` and ``omegaconf``
  importable): ``mmf``, ``extract-regions --arch bottom-up --reference mmf`` against its
  ``tools/scripts/features/frcnn`` run on the same checkpoint, one its own modules wrote.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import common  # this checkout importable  # noqa: F401

from benchmarks.peer_parity import Difference, PeerKind, recognise
from benchmarks.peer_parity import (checkpoints, evaluation, mmf, transformer,
                                   vocab)

PEERS = [
    PeerKind("self-critical.pytorch", "captioning/models/TransformerModel.py",
             "https://github.com/ruotianluo/self-critical.pytorch",
             (vocab.check, transformer.check, evaluation.check, checkpoints.check)),
    PeerKind("mmf", "tools/scripts/features/frcnn/modeling_frcnn.py",
             "https://github.com/facebookresearch/mmf", (mmf.check,)),
]


def print_rows(rows: list[Difference]) -> None:
    print(f"{'check':<12} {'compared':<72} {'max diff':>10} {'bound':>8}  ok")
    for r in rows:
        bound = "stated" if r.bound is None else f"{r.bound:.0e}"
        print(f"{r.check:<12} {r.quantity:<72} {r.value:>10.3g} {bound:>8}  "
              f"{'yes' if r.ok else 'NO'}{'  (' + r.note + ')' if r.note else ''}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", type=Path, action="append", required=True,
                    help="a peer's checkout (repeat for several peers)")
    ap.add_argument("--karpathy", type=Path, action="append", default=[],
                    help="a Karpathy json the vocabulary check runs on too (repeatable)")
    ap.add_argument("--check", action="append", default=[], metavar="NAME",
                    help="run only this check of each peer (repeatable; e.g. checkpoints)")
    args = ap.parse_args(argv)
    rows: list[Difference] = []
    for folder in args.peer:
        kind = recognise(folder.resolve(), PEERS)
        print(f"{kind.name}: {folder}")
        for check in kind.checks:
            if not args.check or check.__module__.rpartition(".")[2] in args.check:
                rows += check(folder.resolve(), args)
    print_rows(rows)
    failed = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(failed)} of {len(rows)} rows within their bounds")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
