"""capstack's command line: parse, call one function, print.

Heavy libraries (torch, h5py) are imported inside the commands that need
them, so ``capstack stages`` and a skipped ``capstack run`` start fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.errors import CapstackError


class CapstackGroup(click.Group):
    """Turns a :class:`CapstackError` into one line on stderr and a non-zero exit."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CapstackError as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=CapstackGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """capstack: an offline feature-caching pipeline and a lightweight captioning trainer."""


def stage_command(name: str, code: str):
    """Register a command that stages may run; ``code`` is the module implementing it."""

    def register(func):
        command = main.command(name)(func)
        command.code_module = code
        return command

    return register


def stage_commands() -> dict[str, str]:
    """Sub-command -> implementing module, for every command a stage may run."""
    return {name: cmd.code_module for name, cmd in main.commands.items()
            if hasattr(cmd, "code_module")}


# -- data ------------------------------------------------------------------------------
@stage_command("shapes", code="pipeline.shapes")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--train", "n_train", default=3000, show_default=True, help="Training images.")
@click.option("--val", "n_val", default=250, show_default=True, help="Validation images.")
@click.option("--test", "n_test", default=250, show_default=True, help="Test images.")
@click.option("--seed", default=0, show_default=True, help="Random seed; same seed, same files.")
@click.option("--size", default=128, show_default=True, help="Image side in pixels.")
def shapes(out_dir, n_train, n_val, n_test, seed, size):
    """Draw the shapes dataset: OUT_DIR/images/ and OUT_DIR/dataset_shapes.json (Karpathy format)."""
    from pipeline.shapes import write_shapes_dataset

    summary = write_shapes_dataset(out_dir, n_train=n_train, n_val=n_val, n_test=n_test,
                                   seed=seed, size=size, progress=True)
    splits = ", ".join(f"{k} {v}" for k, v in summary["splits"].items())
    click.echo(f"shapes: {summary['images']} images ({splits}), {summary['captions']} captions, "
               f"{summary['words']} distinct words -> {summary['json']}")


@stage_command("prepare", code="pipeline.prepare")
@click.argument("dataset_json", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--min-count", default=5, show_default=True,
              help="Words seen fewer times in the train split become <unk>.")
@click.option("--max-len", default=16, show_default=True, help="Captions are truncated to this.")
def prepare(dataset_json, out_dir, min_count, max_len):
    """Karpathy-format json -> vocabulary, captions HDF5, COCO-format references per split."""
    from pipeline.prepare import prepare_captions

    s = prepare_captions(dataset_json, out_dir, min_count=min_count, max_len=max_len,
                         progress=True)
    click.echo(f"prepare: {out_dir}: vocabulary {s['vocab_size']} words (min count {min_count}), "
               f"{s['unk_tokens']} train tokens -> <unk>, {s['truncated']} captions truncated "
               f"to {max_len}")
    for split, n in s["images"].items():
        click.echo(f"  {split:5s} {n:7d} images {s['captions'][split]:8d} captions")


# -- the stage engine -------------------------------------------------------------------
def _stages_options(func):
    func = click.option("-c", "--config", "stages_path", default="stages.yaml", show_default=True,
                        type=click.Path(dir_okay=False, path_type=Path),
                        help="Stages file.")(func)
    func = click.option("--workdir", default=".", show_default=True,
                        type=click.Path(file_okay=False, path_type=Path),
                        help="Folder the stages' paths are relative to; holds the lock file.")(func)
    return func


def _pipeline(stages_path: Path, workdir: Path):
    from pipeline.stagefile import load_stages_file
    from pipeline.stages import Pipeline

    if not workdir.is_dir():
        raise CapstackError(f"{workdir}: --workdir is not a folder")
    commands = stage_commands()
    return Pipeline(load_stages_file(stages_path, commands), workdir, commands)


@main.command("stages")
@_stages_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stages_cmd(stages_path, workdir, as_json):
    """One line per stage: up to date, stale (and why), or never run."""
    statuses = _pipeline(stages_path, workdir).statuses()
    if as_json:
        click.echo(json.dumps({n: {"state": s.state, "reasons": list(s.reasons)}
                               for n, s in statuses.items()}, indent=2))
        return
    width = max(len(n) for n in statuses)
    for name, status in statuses.items():
        click.echo(f"{name:<{width}}  {status.describe()}")


@main.command("run")
@click.argument("stage")
@_stages_options
@click.option("--force", is_flag=True, help="Run even when up to date.")
@click.option("--with-deps", is_flag=True, help="First run the upstream stages that are not up to date.")
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Override a param of this stage for this run (repeatable).")
def run_cmd(stage, stages_path, workdir, force, with_deps, assignments):
    """Run one STAGE, unless it is up to date."""
    pipeline = _pipeline(stages_path, workdir)
    pipeline.run(stage, force=force, with_deps=with_deps, assignments=assignments,
                 report=click.echo)


@main.command("demo")
@_stages_options
def demo_cmd(stages_path, workdir):
    """Every stage in order, each skipped when up to date."""
    pipeline = _pipeline(stages_path, workdir)
    ran = pipeline.run_all(report=click.echo)
    click.echo(f"demo: {len(ran)} stage(s) ran, {len(pipeline.file.order) - len(ran)} up to date.")


if __name__ == "__main__":
    main()
