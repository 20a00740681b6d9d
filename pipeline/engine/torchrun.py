"""``--nproc N``: a command run as N processes under ``torchrun``, never a scheduler of our own.

torchrun starts the processes; each runs the same capstack command (less
``--nproc``) and joins the process group through :func:`pipeline.core.ranks.join`.
The stage engine hands a stage's ``nproc`` to its command the same way.
"""

from __future__ import annotations

import os
from typing import Sequence

from pipeline.core.entry import torchrun_command
from pipeline.core.errors import CapstackError
from pipeline.engine.keeper import run_kept

LAUNCHED_BY_TORCHRUN = "TORCHELASTIC_RUN_ID"


def under_torchrun() -> bool:
    return LAUNCHED_BY_TORCHRUN in os.environ


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Run ``capstack ARGV`` as ``nproc`` processes on this machine; their exit status.

    What ``--nproc N`` does: torchrun starts the processes, and each runs the
    same command (without ``--nproc``), joining the group through :func:`join`.
    """
    if nproc < 1:
        raise CapstackError(f"--nproc: expected a positive number of processes, got {nproc}")
    command = torchrun_command(nproc, argv)
    # through a keeper: stopped or killed, this process takes torchrun's processes with it
    # (subprocess.run killed the launcher alone, and its workers ran on, orphaned)
    return run_kept(command, executable=command[0])


def without_option(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` less ``option VALUE`` and ``option=VALUE`` (what each torchrun process runs)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == option:
            skip = True
        elif not word.startswith(option + "="):
            out.append(word)
    return out
