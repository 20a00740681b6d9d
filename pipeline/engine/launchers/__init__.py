"""Launchers: where a sweep's runs run (pipeline/engine/sweeps.py), one registered file each.

``serial``
    One run after another, in this process (``capstack run`` without --jobs).
``jobs``
    Runs side by side on this machine, each in its own processes: N at a time, GPUs handed
    out round robin (``--devices``), the CPU cores divided between them.
``local``, ``slurm``
    Each run a job of submitit: on this machine (submitit's local executor, what the tests
    run), or on a SLURM cluster, the shared stages first as one job the others depend on.

A launcher is chosen by name (``--launcher``); :func:`choose` picks ``jobs`` when --jobs or
--devices is given, else ``serial``, and checks the options the launcher takes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import yaml

from pipeline.core.errors import CapstackError, shown
from pipeline.core.registry import Registry, import_modules
from pipeline.engine.sweeps import Outcome, Sweep

LAUNCHERS = Registry("launcher")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class LaunchOptions:
    """What ``capstack run`` says of where its runs go: ``jobs`` at once, on ``devices`` (GPU
    ids), and a cluster's job parameters (``partition``, ``gpus_per_job``, ``time_min``,
    ``slurm``: other submitit parameters by their names)."""

    jobs: int | None = None
    devices: tuple[str, ...] = ()
    partition: str | None = None
    gpus_per_job: int | None = None
    time_min: int | None = None
    slurm: Mapping[str, Any] = field(default_factory=dict)

    def given(self) -> list[str]:
        """The options given (their names here)."""
        return [name for name in FLAGS if getattr(self, name)]


FLAGS = {"jobs": "--jobs", "devices": "--devices", "partition": "--slurm-partition",
         "gpus_per_job": "--gpus-per-job", "time_min": "--time", "slurm": "--slurm"}


class Launcher:
    """Runs a sweep's runs (their own stages), the shared stages first. ``takes``: the
    options of :class:`LaunchOptions` it reads; another one given is refused."""

    name = ""
    takes: frozenset[str] = frozenset()

    def check(self, options: LaunchOptions) -> None:
        """Refuse what cannot work before anything runs (an option it does not take)."""
        other = [key for key in options.given() if key not in self.takes]
        if other:
            users = [n for n, launcher in LAUNCHERS.items()
                     if all(k in launcher.takes for k in other)]
            raise CapstackError(f"{', '.join(FLAGS[k] for k in other)}: not an option of "
                                f"--launcher {self.name} (launchers that take "
                                f"{'it' if len(other) == 1 else 'them'}: "
                                f"{', '.join(users) or 'none'})")

    def launch(self, sweep: Sweep, options: LaunchOptions, report: Callable[[str], None]
               ) -> Outcome:
        raise NotImplementedError

    def job_state(self, record: Mapping[str, Any]) -> str:
        """The state of a job this launcher submitted (``exp list``)."""
        return "unknown"


def options_from(jobs: int | None = None, devices: str | None = None,
                 partition: str | None = None, gpus_per_job: int | None = None,
                 time_limit: str | None = None, slurm: Sequence[str] = ()) -> LaunchOptions:
    """:class:`LaunchOptions` from the words of the command line: ``--devices 0,1``, ``--time
    90`` (minutes) or ``1:30:00`` or ``2-00:00:00``, ``--slurm K=V`` (V read as YAML)."""
    return LaunchOptions(jobs, parse_devices(devices) if devices else (), partition,
                         gpus_per_job, parse_minutes(time_limit) if time_limit else None,
                         parse_parameters(slurm))


_DEVICE = re.compile(r"[A-Za-z0-9_:-]+")  # a CUDA index, or a GPU's UUID (GPU-8f...)


def parse_devices(text: str) -> tuple[str, ...]:
    devices = tuple(d.strip() for d in text.split(","))
    bad = next((d for d in devices if not _DEVICE.fullmatch(d)), None)
    if bad is not None:
        raise CapstackError(f"--devices {shown(text)}: expected GPUs as CUDA_VISIBLE_DEVICES "
                            f"names them (0,1,2,3), got {shown(bad)}")
    if len(set(devices)) < len(devices):
        raise CapstackError(f"--devices {shown(text)}: a GPU named twice")
    return devices


_TIME = re.compile(r"(?:([0-9]+)-)?([0-9]+):([0-9]{2})(?::([0-9]{2}))?")


def parse_minutes(text: str) -> int:
    """A job's time limit in whole minutes (rounded up): ``90``, ``1:30``, ``1:30:00``,
    ``2-00:00:00`` (days-hours:minutes:seconds, as SLURM writes it)."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        minutes = int(text)
    else:
        match = _TIME.fullmatch(text)
        if not match:
            raise CapstackError(f"--time {shown(text)}: expected minutes (90) or "
                                f"[DAYS-]HOURS:MINUTES[:SECONDS] (1:30:00)")
        days, hours, mins, secs = (int(g or 0) for g in match.groups())
        minutes = ((days * 24 + hours) * 60 + mins) + (1 if secs else 0)
    if not 1 <= minutes <= 366 * 24 * 60:
        raise CapstackError(f"--time {shown(text)}: from 1 minute to a year")
    return minutes


def parse_parameters(pairs: Sequence[str]) -> dict[str, Any]:
    """``--slurm K=V`` words as submitit's parameters, each value read as YAML (``8`` a
    number, ``32G`` a string); checked by submitit when the executor takes them."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise CapstackError(f"--slurm {shown(pair)}: expected NAME=VALUE, NAME one of "
                                f"submitit's SlurmExecutor parameters (cpus_per_task=8)")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except (yaml.YAMLError, ValueError, RecursionError):
            value = text
        params[key.strip()] = value
    return params


def choose(name: str | None, options: LaunchOptions) -> Launcher:
    """The launcher ``--launcher NAME`` names (default: ``jobs`` with --jobs or --devices,
    else ``serial``), its options checked."""
    if name is None:
        name = "jobs" if options.jobs or options.devices else "serial"
    launcher = LAUNCHERS.get(name)
    launcher.check(options)
    return launcher


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Devices:
    """``--devices``' GPUs handed out round robin: a run started gets the one running the
    fewest of the sweep's runs (None without --devices: the GPUs as the environment has
    them), and gives it back when it ends."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.load = dict.fromkeys(devices, 0)

    def take(self) -> str | None:
        if not self.load:
            return None
        device = min(self.load, key=self.load.__getitem__)
        self.load[device] += 1
        return device

    def give_back(self, device: str | None) -> None:
        if device is not None:
            self.load[device] -= 1


def device_env(device: str | None) -> dict[str, str]:
    """The variable that gives a run's processes its GPU (none when ``device`` is None)."""
    return {"CUDA_VISIBLE_DEVICES": device} if device is not None else {}


def thread_env(jobs: int) -> tuple[dict[str, str], str]:
    """The variables that give each of ``jobs`` processes its share of the cores (at least
    one thread each), and the sentence that says so; a thread count the environment sets
    already is kept."""
    if os.environ.get("OMP_NUM_THREADS"):
        return {}, f"{os.environ['OMP_NUM_THREADS']} CPU threads each (OMP_NUM_THREADS, as set)"
    threads = max(1, cores() // jobs)
    return (dict.fromkeys(THREAD_VARIABLES, str(threads)),
            f"{threads} CPU thread{'s' if threads > 1 else ''} each ({cores()} cores / {jobs} "
            f"at once: OMP_NUM_THREADS={threads})")


import_modules(__name__, __path__)  # each registers itself
