"""How capstack starts itself again: a stage's command, torchrun's processes.

Never ``python -m cli``: ``-m`` puts the working folder first on ``sys.path``,
so a ``click.py`` or ``cli.py`` lying there would run in capstack's place. A
script run by its path gets the script's own folder there instead, and that
folder is capstack's (the project root, or site-packages for a wheel). The
torchrun launcher itself runs with ``-I`` (isolated: neither the working
folder nor ``PYTHON*`` variables on its path); the processes it starts run the
script.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.core.errors import CapstackError

CLI_SCRIPT = Path(__file__).resolve().parents[2] / "cli.py"


def cli_script() -> str:
    if not CLI_SCRIPT.is_file():
        raise CapstackError(f"{CLI_SCRIPT}: capstack's command script is missing; reinstall "
                            f"capstack (`pip install -e .` in its source folder)")
    return str(CLI_SCRIPT)


def capstack_command(argv) -> list[str]:
    """``capstack ARGV`` as a child process runs it."""
    return [sys.executable, cli_script(), *argv]


def torchrun_command(nproc: int, argv) -> list[str]:
    """``torchrun --standalone --nproc-per-node N`` running ``capstack ARGV`` in each process."""
    return [sys.executable, "-I", "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", cli_script(), *argv]
