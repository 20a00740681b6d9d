"""Every approach of the demo, XE then RL (and adversarial), over seeds: means, spreads, orderings.

After `make demo` (its cached features, prepared captions and CIDEr cache),
trains each experiment of configs/experiments/ with cross-entropy, then
fine-tunes it with the reinforcement settings its `rl` stage in stages.yaml
gives (objective, lr, epochs, extra settings), and, for an approach the
`adversarial` stage lists (HACap), trains its adversarial phase from the same
XE start, at each seed; evaluates every run with beam search on the test split. Prints test CIDEr per seed, mean +- std per row, RL - XE
per approach, and each ordering the papers report with its margin in units of
the larger of the two rows' spreads (std over seeds). Runs that finished are
reused, so an interrupted benchmark resumes; results go to OUT/results.json, beside
those of approaches an earlier --only run measured.

    python benchmarks/approaches_over_seeds.py [--seeds 0 1 2] [--out runs/seeds]
        [--only show_tell soft_attention]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.config import load_experiment  # noqa: E402
from trainer.decoders import DECODERS  # noqa: E402
from trainer.evaluation.evaluate import evaluate_checkpoint  # noqa: E402
from trainer.train import train  # noqa: E402

# (better, worse, what the papers say); ">=" rows are "at least as good", "~" rows "about equal"
ORDERINGS = [
    ("soft_attention", "show_tell", ">", "Soft > LSTM (Show-Attend-Tell, Stack-Cap Table 1)"),
    ("top_down", "soft_attention", ">=", "Top-Down >= Soft (Stack-Cap Table 1)"),
    ("stack_cap_star", "top_down", ">", "Stack-Cap* > Top-Down (Stack-Cap Table 1; "
                                        "the demo's Top-Down reads detected regions)"),
    ("stack_cap", "stack_cap_star", ">", "Stack-Cap > Stack-Cap* (Stack-Cap Tables 1-2)"),
    ("hard_attention", "soft_attention", "~", "hard ~ soft (Show-Attend-Tell Table 1)"),
    ("show_tell", "lstm3", ">", "LSTM > LSTM3 layers (Stack-Cap Table 1)"),
    ("hacap", "soft_attention", "~", "HACap ~ Soft (HACap gives no numbers; it calls its BLEU "
                                     "'not so satisfying')"),
]


def rl_settings(stages_file: Path) -> tuple[dict, dict]:
    """Each approach's RL settings (objective, lr, epochs, samples), and the RL stage's params,
    from the stages file."""
    data = yaml.safe_load(stages_file.read_text())
    rl = data["stages"]["rl"]
    return rl["foreach"], {**rl["do"].get("params", {}), "cider": data["params"]["cider"]}


def adversarial_settings(stages_file: Path) -> dict:
    """The approaches the adversarial stage trains, each with its settings (lr, epochs)."""
    stage = yaml.safe_load(stages_file.read_text())["stages"].get("adversarial", {})
    return stage.get("foreach", {})


def run_once(experiment: Path, run: Path, overrides: list[str]) -> float:
    """Train (or resume a finished run) and evaluate: test CIDEr x 100, beam from the config.
    An evaluation newer than the run's best checkpoint is read, not redone."""
    train(load_experiment(experiment, overrides), run, progress=False)
    scored = run / "eval" / "metrics.json"
    if scored.is_file() and scored.stat().st_mtime > (run / "best.pt").stat().st_mtime:
        return 100 * json.loads(scored.read_text())["metrics"]["CIDEr"]
    return 100 * evaluate_checkpoint(run, run / "eval", figures=0, spice=False)["metrics"]["CIDEr"]


def collect(names: list[str], seeds: list[int], out: Path, rl_too: bool = True) -> dict:
    per_approach, params = rl_settings(ROOT / "stages.yaml")
    adversarial = adversarial_settings(ROOT / "stages.yaml")
    results = {}
    for name in names:
        experiment = ROOT / "configs" / "experiments" / f"{name}.yaml"
        rl = per_approach[name]
        for seed in seeds:
            xe_run, rl_run = out / f"{name}-seed{seed}", out / f"{name}-rl-seed{seed}"
            xe = run_once(experiment, xe_run, [f"train.seed={seed}"])
            reinforced = float("nan") if not rl_too else run_once(experiment, rl_run, [
                f"objective.name={rl['objective']}", f"objective.cider_cache={params['cider']}",
                f"objective.samples={rl['samples']}", f"train.init_from={xe_run / 'best.pt'}",
                f"train.lr={rl['lr']}", "train.lr_decay_every=0", f"train.epochs={rl['epochs']}",
                f"train.seed={seed}"])
            results.setdefault(name, {"xe": [], "rl": [], "objective": rl["objective"]})
            results[name]["xe"].append(xe)
            results[name]["rl"].append(reinforced)
            line = f"seed {seed} {name:>15}: test CIDEr XE {xe:5.1f}  " \
                   f"{rl['objective'].upper()} {reinforced:5.1f}"
            if name in adversarial and rl_too:
                adv = adversarial[name]
                results[name].setdefault("adv", []).append(run_once(
                    experiment, out / f"{name}-adv-seed{seed}", [
                        "objective.name=adversarial", f"train.init_from={xe_run / 'best.pt'}",
                        f"train.lr={adv['lr']}", "train.lr_decay_every=0",
                        f"train.epochs={adv['epochs']}", f"train.seed={seed}"]))
                line += f"  Adv {results[name]['adv'][-1]:5.1f}"
            print(line, flush=True)
    return results


def spread(values) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")


def verdict(a: np.ndarray, b: np.ndarray, relation: str) -> tuple[float, float, str]:
    """Mean margin a - b, that margin in units of the larger spread, and whether the relation
    holds: ">" by more than one spread, ">=" not below by more than one, "~" within one."""
    margin = float(a.mean() - b.mean())
    units = margin / max(spread(a), spread(b))
    holds = {">": units > 1, ">=": units > -1, "~": abs(units) <= 1}[relation]
    return margin, units, "holds" if holds else "does not hold"


def report(results: dict) -> None:
    print(f"\n{'approach':>15} {'XE':>12} {'RL':>17} {'RL - XE':>14}")
    for name, r in results.items():
        xe, rl = np.array(r["xe"]), np.array(r["rl"])
        gain = rl - xe
        adv = np.array(r.get("adv", []))
        print(f"{name:>15} {xe.mean():5.1f} ± {spread(xe):4.1f} "
              f"{r['objective'].upper():>4} {rl.mean():5.1f} ± {spread(rl):4.1f} "
              f"{gain.mean():+6.1f} ± {spread(gain):4.1f}"
              + (f"   Adv {adv.mean():5.1f} ± {spread(adv):4.1f}" if adv.size else ""))
    blocks = ["xe"] + (["rl"] if all(np.isfinite(r["rl"]).all() for r in results.values()) else [])
    for block in blocks:
        print(f"\nordering (test CIDEr, {block.upper()}; margin in units of the larger spread)")
        for better, worse, relation, said in ORDERINGS:
            if better in results and worse in results:
                margin, units, holds = verdict(np.array(results[better][block]),
                                               np.array(results[worse][block]), relation)
                print(f"  {said}: {margin:+.1f} ({units:+.1f} spreads) -> {holds}")
    if "rl" in blocks:
        print("\nRL > XE (each approach's RL run against its own XE start)")
        for name, r in results.items():
            margin, units, holds = verdict(np.array(r["rl"]), np.array(r["xe"]), ">")
            print(f"  {name}: {margin:+.1f} ({units:+.1f} spreads) -> {holds}")
        for name, r in results.items():
            if r.get("adv"):
                margin, units, holds = verdict(np.array(r["adv"]), np.array(r["xe"]), ">")
                print(f"  Adv > XE, {name}: {margin:+.1f} ({units:+.1f} spreads) -> {holds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("runs/seeds"))
    ap.add_argument("--only", nargs="+", default=None, help="these approaches (default: all)")
    ap.add_argument("--xe-only", action="store_true", help="train and evaluate XE runs only")
    args = ap.parse_args()
    names = args.only or list(DECODERS)
    saved = args.out / "results.json"
    earlier = json.loads(saved.read_text()) if saved.is_file() else {}
    results = {**earlier, **collect(names, args.seeds, args.out, rl_too=not args.xe_only)}
    saved.write_text(json.dumps(results, indent=1))  # approaches run before (--only) are kept
    report(results)


if __name__ == "__main__":
    main()
