"""What every command module shares: click types and options, bounds, the stage commands.

The commands themselves live beside the code they drive (``pipeline/*/commands.py``,
``trainer/commands/``); ``cli.py`` puts them in one group. Nothing here imports the trainer.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from pipeline.core.errors import CapstackError
from pipeline.core.registry import names_at

# Bounds on the sizes a user gives, checked by click before any work starts (its message names
# the bound): past them a command would exhaust memory (a 20000-pixel side grew a worker to
# 23 GB; --max-len 1e8 asked for 112 GiB) or build something that cannot train (--grid 0).
MAX_SIDE = 2048  # pixels of a resized image's side
MAX_CAPTION_WORDS = 1000
MAX_BATCH = 4096
MAX_WORKERS = 64
MAX_BOXES = 1000
MAX_IMAGES = 10_000_000
MAX_SEED = 2**32 - 1  # what every seeding (numpy's legacy seed included) accepts

ARGV = "capstack.argv"  # the context's meta key: the command line, as --nproc hands it on


class FiniteRange(click.FloatRange):
    """click.FloatRange that refuses nan and inf too (FloatRange lets nan through any range)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number in the range {self._describe_range()}.",
                      param, ctx)
        return number


class NamesOf(click.Choice):
    """click.Choice of the names the code keeps in one place (``"module:NAME"``: a list, a
    dict, a registry, or a function returning one), read when first needed, so that no name
    is typed again here and a command that does not use it imports nothing for it."""

    def __init__(self, source: str):
        self.source = source
        self._names: tuple[str, ...] | None = None
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = names_at(self.source)
        return self._names

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets them; the source decides
        pass


class OutputFile(click.Path):
    """click.Path of a file the command writes: an existing one must be a regular file (or a
    symbolic link), refused before any work starts; the rename that puts the output in place
    would replace a device node or a FIFO with a file (pipeline/core/atomic.py checks it again
    there)."""

    def __init__(self):
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value, param, ctx):
        from pipeline.core.atomic import check_file_replaceable

        path = super().convert(value, param, ctx)
        try:
            check_file_replaceable(path)
        except CapstackError as error:
            self.fail(str(error), param, ctx)
        return path


def given_options(options: dict) -> dict:
    """The options among ``options`` that the command line (or the environment) gave; the
    others are left to the defaults of the dataclass they fill."""
    ctx = click.get_current_context()
    return {name: value for name, value in options.items()
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}


# -- commands that stages run ------------------------------------------------------------
class StageCommand(click.Command):
    """A command that stages may run; ``code_module`` is the module implementing it (its
    source files are the stage's code version)."""

    def __init__(self, *args: Any, code_module: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.code_module = code_module


def stage_command(name: str, code: str):
    """A command that stages may run; ``code`` is the module implementing it."""
    return click.command(name, cls=StageCommand, code_module=code)


def stage_commands(group: click.Group) -> dict[str, str]:
    """Sub-command -> implementing module, for every command of ``group`` a stage may run."""
    return {name: cmd.code_module for name, cmd in group.commands.items()
            if isinstance(cmd, StageCommand)}


def parallel_commands(group: click.Group) -> list[str]:
    """The stage commands of ``group`` that take ``--nproc`` (a stage's ``nproc``)."""
    return [name for name in stage_commands(group)
            if any(p.name == "nproc" for p in group.commands[name].params)]


def command_group() -> click.Group:
    """The group (capstack's ``main``) whose sub-command is running now."""
    root = click.get_current_context().find_root().command
    if not isinstance(root, click.Group):
        raise CapstackError(f"{root.name}: run as a capstack sub-command, not on its own")
    return root


def nproc_option(func):
    """``--nproc N``: run the command as N processes under torchrun (a stage's ``nproc``)."""
    return click.option(
        "--nproc", type=click.IntRange(1, 1024), default=1, show_default=True,
        envvar="CAPSTACK_NPROC",
        help="Processes on this machine: launches torchrun --standalone --nproc-per-node N "
             "(one per GPU). Across machines, start torchrun yourself (docs/scale-out.md).")(func)


def hand_over_to_torchrun(nproc: int) -> None:
    """With ``--nproc N > 1`` outside torchrun: run this same command as N processes under
    torchrun and exit with its status. Returns when this process is to do the work itself."""
    from pipeline.engine.torchrun import launch, under_torchrun, without_option

    if nproc <= 1 or under_torchrun():
        return
    argv = click.get_current_context().meta[ARGV]
    raise SystemExit(launch(nproc, without_option(argv, "--nproc")))


def force_output_option(func):
    """``--force``: replace an output folder that capstack did not write (refused without it)."""
    return click.option("--force", is_flag=True,
                        help="Replace OUT_DIR even if capstack did not write it (its content "
                             "is deleted).")(func)


def echo_summaries(registry) -> None:
    """A registry's components, one a line: name, then what it is."""
    rows = registry.summaries()
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        click.echo(f"{name:<{width}}  {summary}")
