"""capstack's command line: the group every command belongs to, and the table of commands.

Each command lives beside the code it drives (``pipeline/*/commands.py``, ``trainer/commands/``)
and parses, calls one function, prints. Heavy libraries (torch, h5py) are imported inside the
commands that need them, so ``capstack stages`` and a skipped ``capstack run`` start fast.
"""

from __future__ import annotations

import signal
from pathlib import Path

import click

from pipeline import commandline
from pipeline.captions import commands as captions
from pipeline.core.errors import DISK_REFUSALS, CapstackError
from pipeline.demo import commands as demo
from pipeline.engine import commands as engine
from pipeline.features import commands as features
from pipeline.features.commands import SettingOption
from trainer.commands import evaluation, training
from trainer.runs import Stopped

# what tests and scripts import from here (SettingOption: the extract options' class)
__all__ = ["main", "stage_commands", "Terminated", "stop_on_sigterm", "SettingOption"]


class Terminated(Stopped):
    """SIGTERM arrived: raised where the command was, so that its ``with`` blocks (locks,
    atomic files) unwind as for any error, and said (a training records itself stopped)."""


class TerminatedExit(click.ClickException):
    exit_code = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


def stop_on_sigterm(signum, frame):
    raise Terminated("stopped by SIGTERM")


# What a command stopped by SIGTERM leaves, said after "stopped by SIGTERM" (a command not named
# here promises nothing).
WHAT_A_STOP_KEEPS = {
    "train": "its checkpoints are kept; the same command resumes from the last",
    "extract-grid": "whole batches are kept in the store; the same command resumes",
    "extract-regions": "whole batches are kept in the store; the same command resumes",
    "evaluate": "its evaluation folder is as it was before (an evaluation's files change "
                "together); the same command evaluates again from the start",
}


class CapstackGroup(click.Group):
    """Turns a :class:`CapstackError`, SIGTERM and an OS error about a path (read-only, disk
    full, denied) into one line on stderr and a non-zero exit."""

    def parse_args(self, ctx, args):
        ctx.meta[commandline.ARGV] = list(args)  # what --nproc hands to each torchrun process
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        signal.signal(signal.SIGTERM, stop_on_sigterm)
        try:
            return super().invoke(ctx)
        except Terminated as e:
            kept = WHAT_A_STOP_KEEPS.get(ctx.invoked_subcommand or "")
            raise TerminatedExit(f"{e}: {kept}" if kept else str(e)) from None
        except CapstackError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:  # what no writer named itself: the disk or a path refused
            if e.filename is None and e.errno not in DISK_REFUSALS:
                raise
            where = f"{e.filename}: " if e.filename is not None else ""
            raise click.ClickException(f"{where}{e.strerror or e}") from None


def package_version() -> str:
    """capstack's version from its installed metadata; the source's when run uninstalled."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("capstack")
    except PackageNotFoundError:
        from pipeline import __version__

        return __version__


def print_version(ctx, param, value):
    if value and not ctx.resilient_parsing:
        click.echo(f"capstack {package_version()}")
        ctx.exit()


@click.group(cls=CapstackGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=print_version, help="Print capstack's version and exit.")
def main():
    """capstack: an offline feature-caching pipeline and a lightweight captioning trainer."""


def stage_commands() -> dict[str, str]:
    """Sub-command -> implementing module, for every command a stage may run."""
    return commandline.stage_commands(main)


def _pipeline(stages_path: Path, workdir: Path, outs_outside_workdir: bool = False):
    """The stages file's pipeline, its stages running capstack's commands (as `capstack run`
    builds it)."""
    return engine.load_pipeline(stages_path, workdir, main, outs_outside_workdir)


# -- the commands (--help lists them by name) ------------------------------------------------
# the demo's data and models: pipeline/demo/commands.py
main.add_command(demo.shapes)
main.add_command(demo.train_backbone_cmd)
# caption data: pipeline/captions/commands.py
main.add_command(captions.prepare)
# features: pipeline/features/commands.py
main.add_command(features.extract_grid_cmd)
main.add_command(features.extract_regions_cmd)
main.add_command(features.import_features_cmd)
main.add_command(features.export_features_cmd)
main.add_command(features.formats_cmd)
main.add_command(features.inspect_cmd)
main.add_command(features.verify_cmd)
main.add_command(features.stores_cmd)
main.add_command(features.train_detector_cmd)
# training: trainer/commands/training.py
main.add_command(training.train_cmd)
main.add_command(training.runs_cmd)
main.add_command(training.import_checkpoint_cmd)
main.add_command(training.cider_cache_cmd)
main.add_command(training.decoders_cmd)
main.add_command(training.objectives_cmd)
main.add_command(training.rewards_cmd)
# evaluation: trainer/commands/evaluation.py
main.add_command(evaluation.evaluate_cmd)
main.add_command(evaluation.caption_cmd)
main.add_command(evaluation.report_cmd)
# the stage engine: pipeline/engine/commands.py
main.add_command(engine.stages_cmd)
main.add_command(engine.run_cmd)
main.add_command(engine.exp_group)
main.add_command(engine.demo_cmd)


if __name__ == "__main__":
    main()
