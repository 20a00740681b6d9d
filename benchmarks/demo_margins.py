"""The demo's margins over seeds: do the attention models beat show_tell by more than the spread?

Trains and evaluates (beam 5, test split) each demo experiment at several seeds
on the demo's cached features (run `make demo` first), then prints test CIDEr
per seed, the mean and standard deviation, and each model's margin over
show_tell against the spread.

    python benchmarks/demo_margins.py [--seeds 0 1 2] [--out runs/margins]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.config import load_experiment  # noqa: E402
from trainer.evaluation.evaluate import evaluate_checkpoint  # noqa: E402
from trainer.train import train  # noqa: E402

EXPERIMENTS = ["show_tell", "soft_attention", "top_down"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("runs/margins"))
    args = ap.parse_args()
    cider: dict[str, list[float]] = {name: [] for name in EXPERIMENTS}
    for seed in args.seeds:
        for name in EXPERIMENTS:
            config = load_experiment(ROOT / "configs" / "experiments" / f"{name}.yaml",
                                     [f"train.seed={seed}"])
            run = args.out / f"{name}-seed{seed}"
            train(config, run, progress=False)
            metrics = evaluate_checkpoint(run, run / "eval", figures=0, spice=False)
            cider[name].append(100 * metrics["metrics"]["CIDEr"])
            print(f"seed {seed} {name:>15}: test CIDEr {cider[name][-1]:.1f}", flush=True)
    base = np.array(cider["show_tell"])
    print(f"\n{'decoder':>15} {'CIDEr mean':>10} {'std':>5} {'margin over show_tell':>22} "
          f"{'margin / spread':>15}")
    for name in EXPERIMENTS:
        values = np.array(cider[name])
        margin = values.mean() - base.mean()
        spread = max(values.std(ddof=1), base.std(ddof=1)) if len(values) > 1 else float("nan")
        print(f"{name:>15} {values.mean():10.1f} {values.std(ddof=1) if len(values) > 1 else 0:5.1f}"
              f" {margin:22.1f} {margin / spread:15.1f}")


if __name__ == "__main__":
    main()
