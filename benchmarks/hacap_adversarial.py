"""HACap's adversarial phase against maximum likelihood continued, over seeds, on two caption sets.

Does LeakGAN's adversarial training move HACap's generator, and does its D learn? For each
caption setting and seed this trains, with the stages' own settings, these arms (``--arms``;
an arm's ML run is trained too, or found finished, when the arm starts from it):

1. **ml**: ``train@hacap`` (configs/experiments/hacap.yaml: maximum likelihood with D's rounds
   alongside, ``interleaved_pretraining``);
2. **adv**: the ``adversarial@hacap`` stage's settings (configs/experiments/hacap-adv.yaml),
   from the ML run's best checkpoint;
3. **adv_code**: the same with ``objective.credit=leakgan_code``: the credit assignment and
   sampling of LeakGAN's released code where it differs from its paper
   (trainer/objectives/adversarial.py), from the same checkpoint, on the same seeds;
4. **control**: maximum likelihood continued from the same checkpoint, for the same epochs
   at the same lr, with the adversarial stage's own D schedule (its sets, epochs, images and
   lr, a round after every batch): only the generator's objective differs, so adv - control
   is what the adversarial objective itself did (adv_code's D draws its samples with sharper
   logits, the code's, which the control's D does not);
5. **ml_image**, **adv_image**, **control_image**: the three of ml, adv and control with a D
   that also reads the image (``decoder.discriminator_reads_image=true``, a step beyond the
   paper). D learns during the ML phase, so this D has its own ML run, which the other two
   start from.

The report gives each adversarial arm against its own control (adv and adv_code against
control, adv_image against control_image).

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
        [--arms ml adv adv_code control ml_image adv_image control_image]
        [--out runs/hacap_adversarial] [--set objective.discriminator.lr=5e-5 --out OTHER]
        [--jobs 21]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import yaml

from common import ROOT

from pipeline.core.yamlfile import extended_file
from trainer.config import load_experiment
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.train import train

EXPERIMENT = ROOT / "configs" / "experiments" / "hacap.yaml"
SETTINGS = {"grammar": "data/prepared", "free": "data/prepared-free"}
ARMS = ("ml", "adv", "adv_code", "control", "ml_image", "adv_image", "control_image")
START = {"adv": "ml", "adv_code": "ml", "control": "ml",  # the ML run an arm starts from
         "adv_image": "ml_image", "control_image": "ml_image"}
CONTROL = {"adv": "control", "adv_code": "control", "adv_image": "control_image"}
CODE = ["objective.credit=leakgan_code"]
IMAGE = ["decoder.discriminator_reads_image=true"]
FIGURES = (("CIDEr", "CIDEr", 100), ("BLEU-4", "BLEU-4", 100), ("distinct-1", "distinct-1", 100),
           ("distinct-2", "distinct-2", 100), ("words", "vocab_used", 1),
           ("unique", "unique_captions", 100))


def stage_settings(stages_file: Path) -> dict[str, list[str]]:
    """The overrides of :data:`EXPERIMENT` that each train-command stage on it trains, by stage
    name, as the stages file resolves them (vars, foreach, params): what the stage's experiment
    file lays over EXPERIMENT when it extends it (hacap-adv.yaml, :func:`file_overrides`), then
    the stage's ``--set`` words. The benchmark trains what the stages train."""
    from cli import stage_commands
    from pipeline.engine.stagefile import load_stages_file

    stages = load_stages_file(stages_file, stage_commands()).stages
    settings = {}
    for name, st in stages.items():
        if st.command != "train":
            continue
        experiment = (stages_file.parent / st.argv[1]).resolve()
        words = [a for prev, a in zip(st.argv, st.argv[1:]) if prev == "--set"]
        if experiment == EXPERIMENT.resolve():
            settings[name] = words
        elif extended_file(experiment) == EXPERIMENT.resolve():
            settings[name] = file_overrides(experiment) + words
    return settings


def file_overrides(path: Path) -> list[str]:
    """What an experiment file lays over the one it ``extends``, as ``--set`` overrides (each
    mapping's ``name`` first: a component named anew starts afresh, as ``extends`` has it)."""
    own = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "extends"}

    def words(prefix: str, value) -> list[str]:
        if not isinstance(value, dict):
            shown = yaml.safe_dump(value, default_flow_style=True, width=10**6)
            return [f"{prefix}={shown.removesuffix(chr(10)).removesuffix('...').strip()}"]
        keys = sorted(value, key=lambda k: k != "name")
        return [w for k in keys for w in words(f"{prefix}.{k}" if prefix else k, value[k])]

    return words("", own)


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


def arm_overrides(arm: str, stages: dict[str, list[str]]) -> list[str]:
    """An arm's overrides before its seed and start: its stage's, then its variant's."""
    image = IMAGE if arm.endswith("_image") else []
    phase = arm.removesuffix("_image")
    if phase == "ml":
        return stages["train@hacap"] + image
    if phase == "control":
        return control_of(stages["adversarial@hacap"]) + image
    return stages["adversarial@hacap"] + (CODE if phase == "adv_code" else []) + image


def with_starts(arms) -> list[str]:
    """The arms asked for and the ML runs they start from, in :data:`ARMS`'s order."""
    wanted = set(arms) | {START[a] for a in arms if a in START}
    return [a for a in ARMS if a in wanted]


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


def one_arm(setting: str, seed: int, arm: str, out: Path, stages: dict, extra: list[str]
            ) -> dict:
    """Train (or find finished) and evaluate one arm at one seed; its ML start must be done."""
    run = out / setting / f"{arm}-seed{seed}"
    start = out / setting / f"{START[arm]}-seed{seed}" / "best.pt" if arm in START else None
    overrides = [f"data.captions={SETTINGS[setting]}", *seeded(arm_overrides(arm, stages), seed,
                                                               start)]
    seconds = trained(EXPERIMENT, run, overrides + extra)
    return {"seconds": seconds, "best": evaluated(run, "best.pt"),
            "last": evaluated(run, "last.pt"), "val": validation_curve(run), **d_figures(run)}


def one_seed(setting: str, seed: int, out: Path, stages: dict, extra: list[str],
             arms=ARMS) -> dict:
    return {arm: one_arm(setting, seed, arm, out, stages, extra) for arm in with_starts(arms)}


def every_seed_in_parallel(setting: str, seeds: list[int], out: Path, stages: dict,
                           extra: list[str], arms, jobs: int) -> dict[str, dict]:
    """:func:`one_seed` for every seed, ``jobs`` arms at a time, each in its own process: the ML
    runs first, then every arm that starts from one."""
    todo = with_starts(arms)
    results: dict[str, dict] = {str(seed): {} for seed in seeds}
    spawn = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        for level in ([a for a in todo if a not in START], [a for a in todo if a in START]):
            units = [(seed, arm) for seed in seeds for arm in level]
            done = pool.map(one_arm, *zip(*[(setting, seed, arm, out, stages, extra)
                                            for seed, arm in units]))
            for (seed, arm), result in zip(units, done):
                results[str(seed)][arm] = result
    return {seed: {a: r[a] for a in todo} for seed, r in results.items()}


def mean_spread(values) -> str:
    """Mean ± std of the values that exist (a figure is None where it is undefined: distinct-2
    of captions one word long)."""
    values = np.asarray([v for v in values if v is not None and np.isfinite(v)], float)
    return f"{values.mean():6.1f} ± {spread(values):4.1f}" if values.size else "-"


def figure(run: dict, key: str, scale: float) -> float | None:
    return None if run[key] is None else run[key] * scale


def report(setting: str, seeds: dict) -> None:
    rows = list(seeds.values())
    arms = [a for a in ARMS if all(a in r for r in rows)]
    pairs = [(adv, control) for adv, control in CONTROL.items()
             if adv in arms and control in arms]
    mls = [a for a in arms if a not in START]
    print(f"\n== {setting} captions, seeds {', '.join(seeds)} (test split, beam from the "
          f"config; mean ± std over seeds)")
    for which, what in (("best", "the kept checkpoint (best val CIDEr, the start included)"),
                        ("last", "the last checkpoint (where the phase ended)")):
        print(f"-- {what}")
        print(f"{'':>14}" + "".join(f"{name:>16}" for name, _, _ in FIGURES)
              + (f"{'minutes':>10}" if which == "best" else ""))
        for arm in arms:
            cells = [mean_spread([figure(r[arm][which], key, scale) for r in rows])
                     for _, key, scale in FIGURES]
            minutes = np.mean([r[arm]["seconds"] for r in rows]) / 60
            print(f"{arm:>14}" + "".join(f"{c:>16}" for c in cells)
                  + (f"{minutes:10.1f}" if which == "best" else ""))
        for adv, control in pairs:
            for name, key, scale in FIGURES:
                gain = [None if None in (a, c) else a - c for a, c in
                        ((figure(r[adv][which], key, scale), figure(r[control][which], key, scale))
                         for r in rows)]
                print(f"  {f'{adv} - {control}':<26}{name:>10}: {mean_spread(gain)}")
    for ml in mls:
        pretrained = [r[ml]["accuracy"][-1] for r in rows]
        print(f"  {ml}: D held-out accuracy at the end of pre-training: "
              f"{mean_spread(np.array(pretrained) * 100)} % (per seed "
              f"{', '.join(f'{a:.3f}' for a in pretrained)})")
    for r, seed in zip(rows, seeds):
        for ml in mls:
            print(f"  seed {seed}: {ml}: D held-out accuracy in pre-training, by round: "
                  + " ".join(f"{a:.2f}" for a in r[ml]["accuracy"]))
        for adv, control in CONTROL.items():
            acc = r[adv]["accuracy"] if adv in arms else []
            if acc:
                last = (f"; {control}'s last {r[control]['accuracy'][-1]:.3f}"
                        if control in arms and r[control]["accuracy"] else "")
                print(f"  seed {seed}: {adv}: adversarial phase, {len(acc)} rounds: first "
                      f"{acc[0]:.3f}, last {acc[-1]:.3f}, lowest {min(acc):.3f}{last}")
        for arm in (a for a in arms if a in START):
            print(f"  seed {seed}: val CIDEr by epoch, {arm:>13}: "
                  + " ".join(f"{100 * v:.1f}" for v in r[arm]["val"]))
        d_share = {a: r[a]["d_seconds"] / r[a]["seconds"] for a in arms if r[a]["seconds"]}
        print(f"  seed {seed}: minutes " + ", ".join(f"{a} {r[a]['seconds'] / 60:.1f}"
                                                   for a in arms)
              + "; D's rounds' share " + ", ".join(f"{a} {s:.0%}" for a, s in d_share.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                    help="which arms to train and report (default: all); an arm's ML run comes "
                         "with it")
    ap.add_argument("--out", type=Path, default=Path("runs/hacap_adversarial"))
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every run, after the stages' own (e.g. "
                         "objective.discriminator.lr=5e-5); use another --out")
    ap.add_argument("--jobs", type=int, default=1,
                    help="arms trained at once, each in its own process (a GPU or many cores): "
                         "every seed's ML runs, then every arm that starts from one")
    args = ap.parse_args(argv)
    missing = [SETTINGS[s] for s in args.settings if not Path(SETTINGS[s]).is_dir()]
    if missing:
        raise SystemExit(f"{', '.join(missing)}: not prepared; run `capstack run prepare_free "
                         f"--with-deps` and `capstack run extract_grid --with-deps` first")
    stages = stage_settings(ROOT / "stages.yaml")
    results = {}
    for setting in args.settings:
        if args.jobs > 1:
            results[setting] = every_seed_in_parallel(setting, args.seeds, args.out, stages,
                                                      args.extra, args.arms, args.jobs)
        else:
            results[setting] = {str(seed): one_seed(setting, seed, args.out, stages,
                                                    args.extra, args.arms)
                                for seed in args.seeds}
        report(setting, results[setting])
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
