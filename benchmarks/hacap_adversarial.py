"""HACap's adversarial phase against maximum likelihood continued, over seeds, on two caption sets.

Does LeakGAN's adversarial training move HACap's generator, and does its D learn? For each
caption setting and seed this trains, with the stages' own settings:

1. **ML**: ``train@hacap`` (configs/experiments/hacap.yaml: maximum likelihood with D's rounds
   alongside, ``interleaved_pretraining``);
2. **Adv**: the ``adversarial@hacap`` stage's overrides, from the ML run's best checkpoint;
3. **Control**: maximum likelihood continued from the same checkpoint, for the same epochs
   at the same lr, with the adversarial stage's own D schedule (its sets, epochs, images and
   lr, a round after every batch): only the generator's objective differs, so Adv - Control
   is what the adversarial objective itself did.

Every run is evaluated with beam search on the test split, at its kept checkpoint (best val
CIDEr, its start included: what the stage keeps) and at its last (where the phase ended): CIDEr,
BLEU-4 and the diversity figures (distinct-1, distinct-2, words used, unique captions), which
adversarial training is meant to raise. Validation CIDEr by epoch shows each phase's path. D's
held-out accuracy (references against fresh samples of validation images it never trained on) is
read from each run's metrics log: at the end of pre-training, and first/last/lowest in the
adversarial phase. Wall-clock time per phase, and D's share of it.

The settings: ``grammar``, the demo's captions (data/prepared); ``free``, the same images'
captions with freer word order and synonyms (``capstack shapes --captions free``, stage
``prepare_free``: data/prepared-free), where a text-only D has more to find. Both read the
demo's grid store. Finished runs are reused, so an interrupted benchmark resumes.

    python benchmarks/hacap_adversarial.py [--settings grammar free] [--seeds 0 1 2]
        [--out runs/hacap_adversarial] [--set objective.discriminator.lr=5e-5 --out OTHER]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.config import load_experiment  # noqa: E402
from trainer.evaluation.evaluate import evaluate_checkpoint  # noqa: E402
from trainer.train import train  # noqa: E402

EXPERIMENT = ROOT / "configs" / "experiments" / "hacap.yaml"
SETTINGS = {"grammar": "data/prepared", "free": "data/prepared-free"}
PHASES = ("ml", "adv", "control")
FIGURES = (("CIDEr", "CIDEr", 100), ("BLEU-4", "BLEU-4", 100), ("distinct-1", "distinct-1", 100),
           ("distinct-2", "distinct-2", 100), ("words", "vocab_used", 1),
           ("unique", "unique_captions", 100))


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


def spread(values) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")


def control_of(adversarial: list[str]) -> list[str]:
    """The matched control: maximum likelihood continued (``interleaved_pretraining``) with the
    adversarial stage's own D schedule (its ``objective.discriminator.*``: sets, epochs, images,
    lr) and a D round after every batch, as the adversarial phase runs them; every other
    setting (lr, epochs, start, seed) the stage's. Only the generator's objective differs."""
    if any(o.startswith("objective.discriminator_every=") and o != "objective.discriminator_every=1"
           for o in adversarial):
        raise SystemExit("the matched control runs a D round after every batch: the adversarial "
                         "stage's objective.discriminator_every must be 1")
    kept = [o for o in adversarial if not o.startswith("objective.")
            or o.startswith("objective.discriminator.")]
    # the name first (a component named again starts afresh), then D's schedule; round_every
    # is in epochs, and a tiny fraction is one batch (interleaved_pretraining.batches_between)
    return ["objective.name=interleaved_pretraining", *kept, "objective.round_every=1e-6"]


def log_entries(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("kind") == kind]


def trained(experiment: Path, run: Path, overrides: list[str]) -> float:
    """Train (or find finished) ``run``; its wall-clock seconds, kept beside it when it trained
    from its start here (a resumed run's are those of its last part)."""
    clock = run / "wall_seconds.json"
    started = time.perf_counter()
    done = train(load_experiment(experiment, overrides), run, progress=False)
    if done.resumed_at is None or not clock.is_file():
        clock.write_text(json.dumps(time.perf_counter() - started))
    return json.loads(clock.read_text())


def evaluated(run: Path, checkpoint: str) -> dict:
    """Test-split scores and diversity of ``run``'s ``checkpoint`` (best.pt: what the stage
    keeps; last.pt: where the phase ended), reused when newer than it."""
    out = run / ("eval" if checkpoint == "best.pt" else "eval-last")
    scored = out / "metrics.json"
    if not (scored.is_file() and scored.stat().st_mtime > (run / checkpoint).stat().st_mtime):
        evaluate_checkpoint(run / checkpoint, out, figures=0, spice=False)
    metrics = json.loads(scored.read_text())
    return {**metrics["metrics"], **metrics["diversity"]}


def validation_curve(run: Path) -> list[float]:
    """Greedy validation CIDEr per epoch (the start first when the run began from one)."""
    return [e["cider"] for e in log_entries(run, "val")]


def d_figures(run: Path) -> dict:
    """D's held-out accuracy over a run's rounds, and the seconds its rounds took."""
    rounds = log_entries(run, "discriminator")
    accuracy = [r["heldout_accuracy"] for r in rounds]
    return {"accuracy": accuracy, "d_seconds": sum(r["time_d_train"] + r["time_d_heldout"]
                                                   for r in rounds)}


def one_seed(setting: str, seed: int, out: Path, stages: dict, extra: list[str]) -> dict:
    captions = [f"data.captions={SETTINGS[setting]}"]
    ml_run = out / setting / f"ml-seed{seed}"
    runs = {"ml": (ml_run, captions + seeded(stages["train@hacap"], seed)),
            "adv": (out / setting / f"adv-seed{seed}",
                    captions + seeded(stages["adversarial@hacap"], seed, ml_run / "best.pt")),
            "control": (out / setting / f"control-seed{seed}", captions + seeded(
                control_of(stages["adversarial@hacap"]), seed, ml_run / "best.pt"))}
    result = {}
    for phase in PHASES:
        run, overrides = runs[phase]
        seconds = trained(EXPERIMENT, run, overrides + extra)
        result[phase] = {"seconds": seconds, "best": evaluated(run, "best.pt"),
                         "last": evaluated(run, "last.pt"), "val": validation_curve(run),
                         **d_figures(run)}
    return result


def mean_spread(values) -> str:
    values = np.asarray(values, float)
    return f"{values.mean():6.1f} ± {spread(values):4.1f}" if values.size else "-"


def report(setting: str, seeds: dict) -> None:
    rows = list(seeds.values())
    print(f"\n== {setting} captions, seeds {', '.join(seeds)} (test split, beam from the "
          f"config; mean ± std over seeds)")
    for which, what in (("best", "the kept checkpoint (best val CIDEr, the start included)"),
                        ("last", "the last checkpoint (where the phase ended)")):
        print(f"-- {what}")
        print(f"{'':>9}" + "".join(f"{name:>16}" for name, _, _ in FIGURES)
              + (f"{'minutes':>10}" if which == "best" else ""))
        for phase in PHASES:
            cells = [mean_spread([r[phase][which][key] * scale for r in rows])
                     for _, key, scale in FIGURES]
            minutes = np.mean([r[phase]["seconds"] for r in rows]) / 60
            print(f"{phase:>9}" + "".join(f"{c:>16}" for c in cells)
                  + (f"{minutes:10.1f}" if which == "best" else ""))
        for name, key, scale in FIGURES:
            gain = [(r["adv"][which][key] - r["control"][which][key]) * scale for r in rows]
            print(f"  Adv - Control {name:>10}: {mean_spread(gain)}")
    pretrained = [r["ml"]["accuracy"][-1] for r in rows]
    print(f"  D held-out accuracy at the end of pre-training: "
          f"{mean_spread(np.array(pretrained) * 100)} % (per seed "
          f"{', '.join(f'{a:.3f}' for a in pretrained)})")
    for r, seed in zip(rows, seeds):
        print(f"  seed {seed}: D held-out accuracy in pre-training, by round: "
              + " ".join(f"{a:.2f}" for a in r["ml"]["accuracy"]))
        acc = r["adv"]["accuracy"]
        if acc:
            print(f"  seed {seed}: adversarial phase, {len(acc)} rounds: first {acc[0]:.3f}, "
                  f"last {acc[-1]:.3f}, lowest {min(acc):.3f}; control's last "
                  f"{r['control']['accuracy'][-1]:.3f}")
        for phase in ("adv", "control"):
            print(f"  seed {seed}: val CIDEr by epoch, {phase:>7}: "
                  + " ".join(f"{100 * v:.1f}" for v in r[phase]["val"]))
        d_share = {p: r[p]["d_seconds"] / r[p]["seconds"] for p in PHASES if r[p]["seconds"]}
        print(f"  seed {seed}: minutes ML {r['ml']['seconds'] / 60:.1f}, Adv "
              f"{r['adv']['seconds'] / 60:.1f}, Control {r['control']['seconds'] / 60:.1f}; "
              f"D's rounds' share " + ", ".join(f"{p} {s:.0%}" for p, s in d_share.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("runs/hacap_adversarial"))
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every run, after the stages' own (e.g. "
                         "objective.discriminator.lr=5e-5); use another --out")
    args = ap.parse_args()
    missing = [SETTINGS[s] for s in args.settings if not Path(SETTINGS[s]).is_dir()]
    if missing:
        raise SystemExit(f"{', '.join(missing)}: not prepared; run `capstack run prepare_free "
                         f"--with-deps` and `capstack run extract_grid --with-deps` first")
    stages = stage_settings(ROOT / "stages.yaml")
    results = {}
    for setting in args.settings:
        results[setting] = {str(seed): one_seed(setting, seed, args.out, stages, args.extra)
                            for seed in args.seeds}
        report(setting, results[setting])
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
