"""Every approach of the demo, XE then RL (and adversarial), over seeds, through capstack's CLI.

After `make demo` (its cached features, prepared captions and CIDEr cache), for each approach
(or variant) this runs, in the workdir:

    capstack run train@NAME --seeds 0,1,2 [--name VARIANT --set config=FILE]
    capstack run rl@NAME --seeds 0,1,2 [--name VARIANT]  (and rl_mix@, rl_scst@, adversarial@)
    capstack run evaluate@NAME[-rl,...] --seeds 0,1,2 [--name VARIANT]

so each seed other than the stage's own is an experiment (exps/seedS/, exps/VARIANT-seedS/)
and every run already done is skipped: an interrupted benchmark resumes. Then

    capstack report EVALUATIONS... --versus-xe --out OUT

puts every row over its seeds (test CIDEr mean ± std, n), each RL row against its XE row with the
paired bootstrap over every seed's test images, and, for each ordering the papers report, each
variant against its paper row and each row's phases against each other (RL > XE, C2F > SCST for
the Stack-Caps, Adv > ML),

    capstack report --compare A_SEEDS B_SEEDS --out OUT/compare/A-vs-B

gives the difference, its 95 % interval and the share of resamples in which it holds; beside it
the script prints the difference seed by seed (from each evaluation's metrics.json), its spread
and on how many seeds it holds. This script only chooses what to run and compare.

A variant, ``configs/experiments/variants/APPROACH+WHAT.yaml`` (an experiment file that
``extends:`` the approach's and changes what its name says), is the named experiment
``APPROACH+WHAT`` of the approach's stages with ``config`` set to that file.

    python benchmarks/approaches_over_seeds.py [--seeds 0,1,2] [--out reports/seeds]
        [--only show_tell soft_attention stack_cap+feature_embed] [--xe-only | --phases rl]
        [--jobs 30]

With ``--jobs N`` the (row, seed) chains run N at a time, each in its own processes: the demo's
small decoders leave a GPU mostly idle, so many chains can share one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

import numpy as np

from common import ROOT
from common import capstack as run_capstack

from trainer.decoders import DECODERS

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
# the phases after XE: the stage family that trains each, its evaluation's suffix
PHASES = (("rl", "-rl"), ("rl_mix", "-rl-mix"), ("rl_scst", "-rl-scst"), ("adversarial", "-adv"))
# one row's phases against each other: (better, worse, relation, what the papers say)
PHASE_ORDERINGS = [
    ("-rl", "", ">", "RL > XE (every paper's Table: the RL rows above the XE rows)"),
    ("-rl-mix", "", ">", "SCST on CIDEr-D + 0.5 BLEU-4 > XE"),
    ("-rl-scst", "", ">", "SCST > XE"),
    ("-rl", "-rl-scst", ">", "C2F > SCST (Stack-Cap: what its coarse-to-fine reward adds)"),
    ("-adv", "", ">", "Adv > ML (HACap's adversarial phase; the matched control is "
                      "benchmarks/hacap_adversarial.py's)"),
]
VARIANTS = ROOT / "configs" / "experiments" / "variants"


def capstack(*args: str, workdir: Path, log: TextIO | None = None) -> str:
    """Run one capstack command in ``workdir``, its output shown (or written to ``log``) and
    returned."""
    return run_capstack(*args, cwd=workdir, show=True, log=log)[1]


def stage_names(workdir: Path) -> set[str]:
    listing = json.loads(subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "stages", "--json"], cwd=workdir, check=True,
        text=True, stdout=subprocess.PIPE).stdout)
    return set(listing)


def variant_file(name: str) -> Path:
    path = VARIANTS / f"{name}.yaml"
    if not path.is_file():
        raise SystemExit(f"{path}: no such variant (approaches: {', '.join(DECODERS)}; "
                         f"variants: configs/experiments/variants/APPROACH+WHAT.yaml)")
    return path


def folders(name: str, suffix: str, seeds: list[int]) -> list[str]:
    """The evaluation folders of row ``name`` (an approach or a variant) over ``seeds``: the
    stage's own seed 0 in the workdir (a variant's: its experiment), others their seeds'."""
    approach, variant = name.split("+", 1)[0], "+" in name
    folder = f"evals/{approach}{suffix}"
    group = f"exps/{name}/" if variant else ""
    return [f"{group}{folder}" if seed == 0 else
            f"exps/{name + '-' if variant else ''}seed{seed}/{folder}" for seed in seeds]


def row_phases(name: str, stages: set[str], families: set[str]) -> list[tuple[str, str]]:
    """The (stage family, evaluation suffix) of every phase row ``name`` has among
    ``families`` (after XE), XE's first."""
    approach = name.split("+", 1)[0]
    return [("train", "")] + [(family, suffix) for family, suffix in PHASES
                              if family in families and f"{family}@{approach}" in stages
                              and f"evaluate@{approach}{suffix}" in stages]


def run_row(name: str, seeds: list[int], workdir: Path, phases: list[tuple[str, str]],
            log: TextIO | None = None) -> None:
    """Train and evaluate every phase of one row at every seed."""
    approach = name.split("+", 1)[0]
    seeded = ["--seeds", ",".join(map(str, seeds))]
    named = ["--name", name] if "+" in name else []
    config = (["--set", f"config={variant_file(name).relative_to(ROOT)}"] if "+" in name
              else [])
    for family, suffix in phases:
        capstack("run", f"{family}@{approach}", *seeded, *named,
                 *(config if family == "train" else []), workdir=workdir, log=log)
        capstack("run", f"evaluate@{approach}{suffix}", *seeded, *named, workdir=workdir,
                 log=log)


def run_in_parallel(rows: dict[str, list[tuple[str, str]]], seeds: list[int], workdir: Path,
                    jobs: int, logs: Path) -> list[str]:
    """Every (row, seed) chain, ``jobs`` at a time (a GPU, or many cores: each chain is one
    process at a time), each one's output in ``logs/ROW-seedS.log``; the rows whose every chain
    finished. A chain that fails is named with its log and the others go on."""
    logs.mkdir(parents=True, exist_ok=True)

    def chain(name: str, seed: int) -> str | None:
        log_path = logs / f"{name}-seed{seed}.log"
        with log_path.open("w") as log:
            try:
                run_row(name, [seed], workdir, rows[name], log)
            except SystemExit as failed:
                return f"{name} seed {seed}: {failed} (see {log_path})"
        print(f"done: {name} seed {seed}", flush=True)
        return None

    units = [(name, seed) for name in rows for seed in seeds]
    with ThreadPoolExecutor(jobs) as pool:
        failures = dict(zip(units, pool.map(lambda unit: chain(*unit), units)))
    for failure in filter(None, failures.values()):
        print(f"FAILED: {failure}", flush=True)
    return [name for name in rows if not any(failures[(name, seed)] for seed in seeds)]


def evaluated_phases(rows: dict[str, list[tuple[str, str]]], seeds: list[int], workdir: Path
                     ) -> dict[str, list[tuple[str, str]]]:
    """Each row's phases whose evaluation exists at every seed; the rows with any left."""
    kept = {name: [(family, suffix) for family, suffix in row if all(
        (workdir / folder / "metrics.json").is_file() for folder in folders(name, suffix, seeds))]
        for name, row in rows.items()}
    for name, row in rows.items():
        missing = [suffix or "XE" for phase in row if phase not in kept[name]
                   for suffix in [phase[1]]]
        if missing:
            print(f"{name}: not evaluated at every seed: {', '.join(missing)}", flush=True)
    return {name: row for name, row in kept.items() if row}


def compare(a: list[str], b: list[str], out: Path, workdir: Path) -> dict:
    """``capstack report --compare`` over seeds: CIDEr's difference, interval, share."""
    capstack("report", "--compare", ",".join(a), ",".join(b), "--out", str(out),
             workdir=workdir)
    written = json.loads((workdir / out / "compare.json").read_text())
    return next(d for d in written["differences"] if d["value"] == "CIDEr")


def per_seed(a: list[str], b: list[str], workdir: Path) -> list[float]:
    """Test CIDEr of A minus B's, seed by seed (each side's evaluations in seed order)."""
    def cider(folder: str) -> float:
        return json.loads((workdir / folder / "metrics.json").read_text())["metrics"]["CIDEr"]
    return [cider(x) - cider(y) for x, y in zip(a, b)]


def verdict(d: dict, relation: str, seeds: list[float]) -> str:
    """Whether the relation holds on the interval (">" above 0, ">=" not below 0, "~" around
    0), and on how many seeds A is ahead (or, for "~", within 5 CIDEr)."""
    holds = {">": d["low"] > 0, ">=": d["high"] > 0, "~": d["low"] <= 0 <= d["high"]}[relation]
    ahead = sum(abs(x) < 0.05 if relation == "~" else x > 0 for x in seeds)
    spread = np.std(seeds, ddof=1) if len(seeds) > 1 else float("nan")
    return (f"{100 * d['difference']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}], "
            f"ahead in {100 * d['share']:.0f}% -> {'holds' if holds else 'does not hold'}; "
            f"per seed {' '.join(f'{100 * x:+.1f}' for x in seeds)} (std {100 * spread:.1f}), "
            f"{'within 5' if relation == '~' else 'ahead'} on {ahead} of {len(seeds)}")


def comparisons(rows: dict[str, list[str]]) -> list[tuple[str, str, str, str, str, str]]:
    """(row A, its suffix, row B, its suffix, relation, what it says) for every ordering the
    rows run can show: the papers' between approaches, in the XE block and after each one's
    RL; each variant against its paper row; each row's phases against each other."""
    found = []
    for suffix, block in (("", "XE"), ("-rl", "RL")):
        found += [(a, suffix, b, suffix, relation, f"{said} ({block})")
                  for a, b, relation, said in ORDERINGS
                  if a in rows and b in rows and suffix in rows[a] and suffix in rows[b]]
        found += [(name, suffix, name.split("+", 1)[0], suffix, "~",
                   f"{name} ~ {name.split('+', 1)[0]} ({block})")
                  for name in rows if "+" in name and name.split("+", 1)[0] in rows
                  and suffix in rows[name] and suffix in rows[name.split("+", 1)[0]]]
    found += [(name, better, name, worse, relation, f"{name}: {said}")
              for name, suffixes in rows.items()
              for better, worse, relation, said in PHASE_ORDERINGS
              if better in suffixes and worse in suffixes]
    return found


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", default=["0,1,2"],
                    help="seeds: 0,1,2 or 0-2 (as capstack run --seeds), or 0 1 2")
    ap.add_argument("--out", type=Path, default=Path("reports/seeds"))
    ap.add_argument("--workdir", type=Path, default=ROOT)
    ap.add_argument("--only", nargs="+", default=None, help="these rows (default: every "
                                                            "approach)")
    ap.add_argument("--xe-only", action="store_true", help="train and evaluate XE runs only")
    ap.add_argument("--phases", nargs="+", choices=[family for family, _ in PHASES],
                    default=[family for family, _ in PHASES],
                    help="the phases after XE to run where a row has them (default: all)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: compare the evaluations the workdir holds (made there or "
                         "on another machine), each phase whose every seed is evaluated")
    ap.add_argument("--jobs", type=int, default=1,
                    help="(row, seed) chains run at once, each its stages in turn, its output "
                         "in OUT/logs/ROW-seedS.log (a GPU or many cores); default 1: in turn")
    args = ap.parse_args(argv)
    from pipeline.engine.experiments import parse_seeds

    seeds, workdir = parse_seeds(",".join(args.seeds)), args.workdir.resolve()
    names, stages = args.only or list(DECODERS), stage_names(workdir)
    families = set() if args.xe_only else set(args.phases)
    phases = {name: row_phases(name, stages, families) for name in names}
    if args.report_only:
        phases = evaluated_phases(phases, seeds, workdir)
    elif args.jobs > 1:
        done = run_in_parallel(phases, seeds, workdir, args.jobs, workdir / args.out / "logs")
        phases = {name: phases[name] for name in done}
    else:
        for name in names:
            run_row(name, seeds, workdir, phases[name])
    rows = {name: [suffix for _, suffix in row] for name, row in phases.items()}
    evaluations = [",".join(folders(name, suffix, seeds)) for name, suffixes in rows.items()
                   for suffix in suffixes]
    capstack("report", *[f for e in evaluations for f in e.split(",")], "--versus-xe",
             "--out", str(args.out), workdir=workdir)
    lines = []
    for a, a_suffix, b, b_suffix, relation, said in comparisons(rows):
        a_folders, b_folders = folders(a, a_suffix, seeds), folders(b, b_suffix, seeds)
        d = compare(a_folders, b_folders,
                    args.out / "compare" / f"{a}{a_suffix}-vs-{b}{b_suffix}", workdir)
        lines.append(f"  {said}: {verdict(d, relation, per_seed(a_folders, b_folders, workdir))}")
    groups = [f"{n + '-' if '+' in n else ''}seed{s}" for n in rows for s in seeds if s != 0]
    groups = list(dict.fromkeys(groups + [n for n in rows if "+" in n]))
    capstack("exp", "show", *groups, workdir=workdir)  # each seed's row, beside seed 0's
    print(f"\ntest CIDEr differences over seeds {seeds} (paired bootstrap over every "
          f"seed's images, 95% interval):")
    print("\n".join(lines) or "  (no ordering between the rows run)")


if __name__ == "__main__":
    main()
