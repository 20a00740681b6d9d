"""Every approach of the demo, XE then RL (and adversarial), over seeds: means, spreads, orderings.

After `make demo` (its cached features, prepared captions and CIDEr cache),
trains each experiment of configs/experiments/ with cross-entropy, then every
phase stages.yaml trains from that XE run with the same overrides its stage
passes (`rl@NAME`: SCST or C2F; `rl_mix@NAME`: SCST on a mixed reward;
`adversarial@NAME`: HACap's adversarial phase), from the same XE start, at each
seed; evaluates every run with beam search on the test split. Prints test CIDEr per
seed, mean +- std per row, RL - XE per approach, and each ordering the papers report
with its margin in units of the larger of the two rows' spreads (std over seeds).
Runs that finished are reused, so an interrupted benchmark resumes; results go to
OUT/results.json, beside those of approaches an earlier --only run measured.

A variant, ``configs/experiments/variants/APPROACH+WHAT.yaml`` (an experiment that
``extends:`` the approach's and changes what its name says), is a row of its own:
``--only stack_cap stack_cap+feature_embed`` trains both, the variant with its
approach's stage settings, and prints what the change did, in spreads.

    python benchmarks/approaches_over_seeds.py [--seeds 0 1 2] [--out runs/seeds]
        [--only show_tell soft_attention stack_cap+feature_embed]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

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


# the phases a run can have after XE, each the stage family that trains it from train@NAME
PHASES = (("rl", "rl"), ("mix", "rl_mix"), ("adv", "adversarial"))


def stage_settings(stages_file: Path) -> dict[str, list[str]]:
    """Every train-command stage's ``--set`` overrides, by stage name, as the stages file
    resolves them (vars, foreach, params): the benchmark trains what the stages train."""
    from cli import stage_commands
    from pipeline.engine.stagefile import load_stages_file

    stages = load_stages_file(stages_file, stage_commands()).stages
    return {name: [a for prev, a in zip(st.argv, st.argv[1:]) if prev == "--set"]
            for name, st in stages.items() if st.command == "train"}


def seeded(overrides: list[str], seed: int, start: Path | None = None) -> list[str]:
    """A stage's overrides at ``seed``, starting from ``start`` (the seed's own XE run)."""
    kept = [o for o in overrides if not o.startswith(("train.seed=", "train.init_from="))]
    return kept + [f"train.seed={seed}"] + ([f"train.init_from={start}"] if start else [])


def label(overrides: list[str]) -> str:
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("objective.name=")), "xe")
    return name.upper()


def run_once(experiment: Path, run: Path, overrides: list[str]) -> float:
    """Train (or resume a finished run) and evaluate: test CIDEr x 100, beam from the config.
    An evaluation newer than the run's best checkpoint is read, not redone."""
    train(load_experiment(experiment, overrides), run, progress=False)
    scored = run / "eval" / "metrics.json"
    if scored.is_file() and scored.stat().st_mtime > (run / "best.pt").stat().st_mtime:
        return 100 * json.loads(scored.read_text())["metrics"]["CIDEr"]
    return 100 * evaluate_checkpoint(run, run / "eval", figures=0, spice=False)["metrics"]["CIDEr"]


EXPERIMENTS = ROOT / "configs" / "experiments"


def approach_of(name: str) -> str:
    """The approach a row trains as: a variant APPROACH+WHAT trains as APPROACH."""
    return name.split("+", 1)[0]


def experiment_file(name: str) -> Path:
    """An approach's experiment, or a variant's (configs/experiments/variants/)."""
    path = EXPERIMENTS / ("variants" if "+" in name else "") / f"{name}.yaml"
    if not path.is_file():
        raise SystemExit(f"{path}: no such experiment (approaches: {', '.join(DECODERS)}; "
                         f"variants: configs/experiments/variants/APPROACH+WHAT.yaml)")
    return path


def collect(names: list[str], seeds: list[int], out: Path, rl_too: bool = True) -> dict:
    settings = stage_settings(ROOT / "stages.yaml")
    results = {}
    for name in names:
        experiment, approach = experiment_file(name), approach_of(name)
        phases = [(key, settings[f"{family}@{approach}"]) for key, family in PHASES
                  if rl_too and f"{family}@{approach}" in settings]
        entry = results.setdefault(name, {"xe": [], "rl": [], "objective": "-"})
        for seed in seeds:
            xe_run = out / f"{name}-seed{seed}"
            xe = run_once(experiment, xe_run, seeded(settings.get(f"train@{approach}", []), seed))
            entry["xe"].append(xe)
            line = f"seed {seed} {name:>15}: test CIDEr XE {xe:5.1f}"
            for key, overrides in phases:
                suffix = {"rl": "rl", "mix": "rl-mix", "adv": "adv"}[key]
                score = run_once(experiment, out / f"{name}-{suffix}-seed{seed}",
                                 seeded(overrides, seed, xe_run / "best.pt"))
                entry.setdefault(key, []).append(score)
                entry["objective" if key == "rl" else f"{key}_objective"] = label(overrides)
                line += f"  {label(overrides) if key != 'mix' else 'MIX'} {score:5.1f}"
            if not any(key == "rl" for key, _ in phases):
                entry["rl"].append(float("nan"))
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
        adv, mix = np.array(r.get("adv", [])), np.array(r.get("mix", []))
        print(f"{name:>15} {xe.mean():5.1f} ± {spread(xe):4.1f} "
              f"{r['objective'].upper():>4} {rl.mean():5.1f} ± {spread(rl):4.1f} "
              f"{gain.mean():+6.1f} ± {spread(gain):4.1f}"
              + (f"   Adv {adv.mean():5.1f} ± {spread(adv):4.1f}" if adv.size else "")
              + (f"   mixed reward {mix.mean():5.1f} ± {spread(mix):4.1f}" if mix.size else ""))
    blocks = ["xe"] + (["rl"] if all(np.isfinite(r["rl"]).all() for r in results.values()) else [])
    for block in blocks:
        print(f"\nordering (test CIDEr, {block.upper()}; margin in units of the larger spread)")
        for better, worse, relation, said in ORDERINGS:
            if better in results and worse in results:
                margin, units, holds = verdict(np.array(results[better][block]),
                                               np.array(results[worse][block]), relation)
                print(f"  {said}: {margin:+.1f} ({units:+.1f} spreads) -> {holds}")
    variants = [(name, approach_of(name)) for name in results
                if "+" in name and approach_of(name) in results]
    for block in blocks if variants else []:
        print(f"\nvariants against their paper rows (test CIDEr, {block.upper()})")
        for name, approach in variants:
            margin, units, _ = verdict(np.array(results[name][block]),
                                       np.array(results[approach][block]), "~")
            print(f"  {name} - {approach}: {margin:+.1f} ({units:+.1f} spreads)")
    if "rl" in blocks:
        print("\nRL > XE (each approach's RL run against its own XE start)")
        for name, r in results.items():
            margin, units, holds = verdict(np.array(r["rl"]), np.array(r["xe"]), ">")
            print(f"  {name}: {margin:+.1f} ({units:+.1f} spreads) -> {holds}")
        for name, r in results.items():
            if r.get("mix"):
                margin, units, holds = verdict(np.array(r["mix"]), np.array(r["rl"]), "~")
                print(f"  mixed reward ~ CIDEr-D reward, {name}: {margin:+.1f} "
                      f"({units:+.1f} spreads) -> {holds}")
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
