"""``jobs``: the runs side by side on this machine, each ``capstack run`` a process of its own.

At most ``--jobs N`` at once. With ``--devices 0,1,2,3`` each process gets one GPU
(``CUDA_VISIBLE_DEVICES``), the one running the fewest of the sweep's processes (each its own
while N is at most the devices); the CPU cores are divided between the N (``OMP_NUM_THREADS``
= cores // N, at least 1, unless set). The shared stages run first, here. A run that fails is
said with its log and the others go on; stopped (Ctrl-C, SIGTERM), every process is asked to
stop (a training at a batch boundary), waited for, and what the same command again does is
said: it skips the runs done and resumes the ones stopped.
"""

from __future__ import annotations

import subprocess
import time
from collections import deque
from typing import Callable

from pipeline.engine.launchers import (LAUNCHERS, Devices, Launcher, LaunchOptions, device_env,
                                       thread_env)
from pipeline.engine.sweeps import (ExperimentJob, Outcome, Run, Sweep, ended, last_error, stop,
                                    typed, with_states)

POLL = 0.2  # seconds between looks at the running processes


class Jobs(Launcher):
    """Side by side on this machine: --jobs N processes at once, the cores divided, a GPU
    each (--devices)."""

    name = "jobs"
    takes = frozenset({"jobs", "devices"})

    def launch(self, sweep: Sweep, options: LaunchOptions, report: Callable[[str], None]
               ) -> Outcome:
        sweep = with_states(sweep)
        n = options.jobs or max(1, len(options.devices))
        env, threads = thread_env(n)
        gpus = f"GPUs {','.join(options.devices)} round robin" if options.devices else \
            "GPUs as the environment has them"
        todo = sweep.to_run
        outcome = Outcome(skipped=[r.label for r in sweep.runs if r not in todo])
        report(f"== {len(sweep.runs)} run{'s' if len(sweep.runs) > 1 else ''} of "
               f"'{sweep.stage}', {n} at a time; {threads}; {gpus}")
        for label in outcome.skipped:
            report(f"[{label}] up to date, skipped")
        sweep.save()
        if sweep.shared:
            report(f"== the stages the runs share, first: "
                   f"{', '.join(s.stage for s in sweep.shared)}")
            sweep.run_shared_here(report)
        pending = deque(todo)
        running: dict[subprocess.Popen, tuple[Run, ExperimentJob, float]] = {}
        devices = Devices(options.devices)
        try:
            while pending or running:
                while pending and len(running) < n:
                    run = pending.popleft()
                    device = devices.take()
                    job = sweep.job(run, {**env, **device_env(device)})
                    child = job.start(job.commands[0])
                    running[child] = (run, job, time.monotonic())
                    on = f" on GPU {device}" if device is not None else ""
                    report(f"[{run.label}] started{on}: log {typed(job.log)}")
                time.sleep(POLL)
                for child in [c for c in running if c.poll() is not None]:
                    run, job, started = running.pop(child)
                    devices.give_back(dict(job.env).get("CUDA_VISIBLE_DEVICES"))
                    took = _duration(time.monotonic() - started)
                    if child.returncode == 0:
                        outcome.done.append(run.label)
                        report(f"[{run.label}] done in {took}")
                    else:
                        why = f"{ended(child.returncode)}: {last_error(run.log)}"
                        outcome.failed.append((run.label, why, typed(run.log)))
                        report(f"[{run.label}] failed after {took}, {why}; log {typed(run.log)}")
        except BaseException:
            report(f"stopping {len(running)} running: each stops where it can resume ...")
            stop(list(running))
            outcome.stopped = [run.label for run, _, _ in running.values()]
            outcome.not_started = [run.label for run in pending]
            report(outcome.summary())
            report(outcome.rerun())
            raise
        report(outcome.summary())
        return outcome


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


LAUNCHERS.register("jobs")(Jobs())
