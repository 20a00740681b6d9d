"""The stage engine's commands: stages, run, exp (list, show, diff, remove), demo."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.commandline import NamesOf, command_group, parallel_commands, stage_commands
from pipeline.core.errors import CapstackError


def _stages_options(func):
    func = click.option("-c", "--config", "stages_path", default="stages.yaml", show_default=True,
                        type=click.Path(dir_okay=False, path_type=Path),
                        help="Stages file.")(func)
    func = click.option("--workdir", default=".", show_default=True,
                        type=click.Path(file_okay=False, path_type=Path),
                        help="Folder the stages' paths are relative to; holds the lock file.")(func)
    return func


def _pipeline(stages_path: Path, workdir: Path, outs_outside_workdir: bool = False):
    """The stages file's pipeline, its commands those of the running capstack."""
    return load_pipeline(stages_path, workdir, command_group(), outs_outside_workdir)


def load_pipeline(stages_path: Path, workdir: Path, group: click.Group,
                  outs_outside_workdir: bool = False):
    """The stages file's pipeline, run in ``workdir``; its stages may run the stage commands of
    ``group`` (capstack's, the trainer's included: cli.py's ``main``)."""
    from pipeline.engine.stagefile import load_stages_file
    from pipeline.engine.stages import Pipeline

    if not workdir.is_dir():
        raise CapstackError(f"{workdir}: --workdir is not a folder")
    commands = stage_commands(group)
    return Pipeline(load_stages_file(stages_path, commands, parallel_commands(group)), workdir,
                    commands, outs_outside_workdir)


def outs_outside_option(func):
    return click.option("--outs-outside-workdir", is_flag=True,
                        help="Let stages write outs outside the workdir (../x, /abs/path); "
                             "refused otherwise.")(func)


def _name_option(func):
    return click.option("--name", "experiment", default=None, metavar="NAME",
                        help="The named experiment (exps/NAME/): its own stages, the "
                             "baseline's shared.")(func)


def _in_experiment(pipeline, name: str | None):
    """``pipeline`` as experiment ``name`` has it (``pipeline`` itself for no name)."""
    if not name:
        return pipeline
    from pipeline.engine.experiments import pipeline_of, read_experiment

    return pipeline_of(pipeline, read_experiment(pipeline.workdir, name))


@click.command("stages")
@_stages_options
@_name_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stages_cmd(stages_path, workdir, experiment, as_json):
    """One line per stage: up to date, stale (and why), or never run; with --name, as the
    experiment has them (its own stages, and the baseline's it shares, said so). When the file
    names its demo, the stages `capstack demo` runs are marked demo, and a last line counts
    their states apart from the others'."""
    pipeline = _in_experiment(_pipeline(stages_path, workdir), experiment)
    statuses, off = pipeline.statuses(), pipeline.file.off
    own = getattr(pipeline, "own", None)
    demo = set(pipeline.demo_stages()) if pipeline.file.demo else None
    if as_json:
        listing = {n: {"state": s.state, "reasons": list(s.reasons),
                       **({} if own is None else {"own": n in own}),
                       **({} if demo is None else {"demo": n in demo})}
                   for n, s in statuses.items()}
        listing |= {n: {"state": "off", "reasons": [why]} for n, why in off.items()}
        click.echo(json.dumps(listing, indent=2))
        return
    width = max(len(n) for n in [*statuses, *off])
    mark = (lambda name: "") if demo is None else \
        (lambda name: "demo  " if name in demo else "      ")
    for name, status in statuses.items():
        shared = "  (baseline's)" if own is not None and name not in own else ""
        click.echo(f"{name:<{width}}  {mark(name)}{status.describe()}{shared}")
    for name, why in off.items():
        click.echo(f"{name:<{width}}  {mark(name)}off ({why})")
    if demo is not None and len(demo) < len(statuses):
        click.echo(_demo_summary(pipeline.file.demo, statuses, demo))


def _demo_summary(targets, statuses: dict, demo: set[str]) -> str:
    """``demo (capstack demo: report and what it needs): 16 stages, 16 up to date; the other
    39: 39 never run``: whether the demo is done, apart from the stages it does not run."""
    def counted(names) -> str:
        counts: dict[str, int] = {}
        for name in names:
            counts[statuses[name].state] = counts.get(statuses[name].state, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in counts.items())

    others = [n for n in statuses if n not in demo]
    stages = f"{len(demo)} stage{'' if len(demo) == 1 else 's'}"
    return (f"demo (`capstack demo`: {', '.join(targets)} and what it needs): {stages}, "
            f"{counted(n for n in statuses if n in demo)}; the other {len(others)}: "
            f"{counted(others)}")


class LaunchersOption(click.Option):
    """``--launcher``: its help lists the registered launchers, each with its summary (read
    from the registry when help is shown)."""

    def get_help_record(self, ctx):
        from pipeline.engine.launchers import LAUNCHERS

        self.help = (self.help or "").split(" Launchers: ")[0] + " Launchers: " + "; ".join(
            f"{name}: {summary.rstrip('.')}" for name, summary in LAUNCHERS.summaries()) + "."
        return super().get_help_record(ctx)


@click.command("run")
@click.argument("stage")
@_stages_options
@click.option("--force", is_flag=True, help="Run even when up to date.")
@click.option("--with-deps", is_flag=True,
              help="First run the upstream stages that are not up to date.")
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Run under an experiment with this param of the stage set (repeatable): "
                   "its outs, and those of what depends on it, in exps/NAME/, the baseline's "
                   "untouched. Named by the settings unless --name names it. Several values "
                   "(lr=1e-4,5e-4; a string's as a YAML list: 'config=[a.yaml, b.yaml]') make "
                   "a grid of experiments.")
@click.option("--name", "experiment", default=None, metavar="NAME",
              help="Run under experiment NAME (made with the --set settings when new; the "
                   "same name again must have the same).")
@click.option("--seeds", default=None, metavar="0,1,2",
              help="Run once per seed (the param the stages file's seed_param names; 0-4 is "
                   "0,1,2,3,4): a seed other than the stage's own runs as experiment seedS "
                   "(NAME-seedS).")
@click.option("--jobs", type=click.IntRange(1, 1024), default=None,
              help="Run the experiments N at a time, each its own processes, the CPU cores "
                   "divided between them (--launcher jobs unless another is named).")
@click.option("--devices", default=None, metavar="0,1,2,3",
              help="GPUs for --jobs (and --launcher local): one to each process, round robin "
                   "(CUDA_VISIBLE_DEVICES).")
@click.option("--launcher", "launcher_name", default=None, cls=LaunchersOption,
              type=NamesOf("pipeline.engine.launchers:LAUNCHERS"),
              help="Where the experiments run [serial; jobs with --jobs or --devices].")
@click.option("--slurm-partition", default=None, help="--launcher slurm: the partition.")
@click.option("--gpus-per-job", type=click.IntRange(1, 64), default=None,
              help="--launcher slurm: GPUs of each job.")
@click.option("--time", "time_limit", default=None, metavar="MINUTES|H:MM:SS",
              help="--launcher slurm (or local): each job's time limit; a job that reaches it "
                   "stops where it can resume and is requeued.")
@click.option("--slurm", "slurm_params", multiple=True, metavar="NAME=VALUE",
              help="--launcher slurm: another of submitit's SlurmExecutor parameters "
                   "(cpus_per_task=8, mem=32G, account=lab; repeatable).")
@outs_outside_option
def run_cmd(stage, stages_path, workdir, force, with_deps, assignments, experiment, seeds,
            jobs, devices, launcher_name, slurm_partition, gpus_per_job, time_limit,
            slurm_params, outs_outside_workdir):
    """Run one STAGE, unless it is up to date; with --set, --name or --seeds, as named
    experiments beside the baseline (`capstack exp list`); with --jobs or --launcher, side by
    side (docs/scale-out.md)."""
    from pipeline.engine.experiments import parse_seeds
    from pipeline.engine.launchers import choose, options_from
    from pipeline.engine.sweeps import plan

    options = options_from(jobs, devices, slurm_partition, gpus_per_job, time_limit,
                           slurm_params)
    launcher = choose(launcher_name, options)
    pipeline = _pipeline(stages_path, workdir, outs_outside_workdir)
    sweep = plan(pipeline, stage, assignments, experiment, parse_seeds(seeds) if seeds else (),
                 force=force, with_deps=with_deps)
    outcome = launcher.launch(sweep, options, click.echo)
    if outcome.failed:
        raise CapstackError(f"{len(outcome.failed)} of {len(sweep.runs)} runs failed: "
                            + "; ".join(outcome.failures()))


@click.group("exp")
def exp_group():
    """Named experiments (`capstack run STAGE --set K=V --name NAME`): list, show, diff,
    remove."""


def _experiments(stages_path: Path, workdir: Path, names=()):
    """The baseline and the experiments NAMES (default: every usable one, the others said)."""
    from pipeline.engine.experiments import pipeline_of, pipelines_listed, read_experiment

    baseline = _pipeline(stages_path, workdir)
    if not names:
        return baseline, pipelines_listed(baseline)
    return baseline, [pipeline_of(baseline, read_experiment(baseline.workdir, n)) for n in names]


def _echo_table(rows) -> None:
    from pipeline.core.texttable import text_table

    for line in text_table(rows):
        click.echo(line)


@exp_group.command("list")
@_stages_options
def exp_list_cmd(stages_path, workdir):
    """Each experiment: its settings against the baseline's, the state of its own stages, and
    the job a launcher submitted for it (its id and state)."""
    from pipeline.engine.experiment_views import jobs_text, listing

    baseline, pipelines = _experiments(stages_path, workdir)
    if not pipelines:
        click.echo(f"no experiments in {baseline.workdir} (make one: capstack run STAGE "
                   f"--set NAME=VALUE --name NAME)")
    else:
        _echo_table(listing(baseline, pipelines))
    jobs = jobs_text(baseline.workdir)
    if jobs:
        click.echo(f"the baseline's jobs: {jobs}")


@exp_group.command("show")
@click.argument("names", nargs=-1)
@_stages_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def exp_show_cmd(names, stages_path, workdir, as_json):
    """The experiments' evaluations (all, or NAMES) beside the baseline's: the settings that
    differ, each stage's state, the metrics (%)."""
    from pipeline.engine.experiment_views import show

    baseline, pipelines = _experiments(stages_path, workdir, names)
    rows = show(baseline, pipelines)
    if as_json:
        click.echo(json.dumps([dict(zip(rows[0], row)) for row in rows[1:]], indent=2))
    elif len(rows) == 1:
        click.echo("no evaluation of an experiment's own yet (capstack run evaluate@... "
                   "--name NAME --with-deps)")
    else:
        _echo_table(rows)


@exp_group.command("diff")
@click.argument("a")
@click.argument("b", required=False)
@_stages_options
def exp_diff_cmd(a, b, stages_path, workdir):
    """The params experiment A sets otherwise than B (default: the baseline), then the metrics
    (%) of the evaluations both have that differ."""
    from pipeline.engine.experiment_views import diff

    baseline, pipelines = _experiments(stages_path, workdir, [a] + ([b] if b else []))
    _echo_table(diff(baseline, pipelines[0], pipelines[1] if b else None))


@exp_group.command("remove")
@click.argument("names", nargs=-1, required=True)
@_stages_options
def exp_remove_cmd(names, stages_path, workdir):
    """Remove experiments: their folders (own outs, lock, links), never the baseline's files."""
    from pipeline.engine.experiments import remove_experiments

    for folder in remove_experiments(workdir, names):
        click.echo(f"removed {folder}")


@click.command("demo")
@_stages_options
@outs_outside_option
def demo_cmd(stages_path, workdir, outs_outside_workdir):
    """The stages file's demo (its `demo:` stages and all they need; else every stage), in
    order, each skipped when up to date."""
    pipeline = _pipeline(stages_path, workdir, outs_outside_workdir)
    targets, total = pipeline.file.demo, len(pipeline.demo_stages())
    if not targets:
        ran = pipeline.run_all(report=click.echo)
    else:
        ran = []
        for target in targets:
            ran += pipeline.run(target, with_deps=True, report=click.echo)
    click.echo(f"demo: {len(ran)} stage(s) ran, {total - len(ran)} up to date.")
