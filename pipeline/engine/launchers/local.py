"""``local``: each run a job of submitit's local executor, on this machine: the very job
objects ``--launcher slurm`` submits, run as processes here (``pip install capstack[slurm]``).

The shared stages run first, as one job, waited for; then at most ``--jobs N`` runs at once
(default 1), each with its share of the cores and, with ``--devices``, a GPU round robin, as
``--launcher jobs`` gives them. The command waits for every job and says which failed, with
its log; stopped (Ctrl-C, SIGTERM), it cancels the jobs, waits until their stages have
stopped, and says what the same command again does.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Callable, Mapping

from pipeline.core.errors import CapstackError
from pipeline.engine.launchers import LAUNCHERS, Devices, LaunchOptions, device_env, thread_env
from pipeline.engine.launchers.slurm import Submitit, submitit_module
from pipeline.engine.sweeps import Outcome, Run, Sweep, last_error, typed, wait_unlocked

WEEK_MIN = 7 * 24 * 60  # a local job's time limit unless --time says one
POLL = 0.2  # seconds between looks at the jobs


class Local(Submitit):
    """Each run a job of submitit's local executor, on this machine: the jobs --launcher slurm
    submits, --jobs N at a time, waited for."""

    name = "local"
    takes = frozenset({"jobs", "devices", "time_min"})

    def executor(self, sweep: Sweep) -> Any:
        return submitit_module().LocalExecutor(folder=self.folder(sweep))

    def parameters(self, options: LaunchOptions, label: str, after: str | None
                   ) -> dict[str, Any]:
        # the GPU is set in the job's environment (CUDA_VISIBLE_DEVICES), not by submitit,
        # whose local executor hands every job the first GPUs
        return {"timeout_min": options.time_min or WEEK_MIN, "gpus_per_node": 0}

    def environment(self, options: LaunchOptions) -> dict[str, str]:
        return thread_env(options.jobs or 1)[0]

    def launch(self, sweep: Sweep, options: LaunchOptions, report: Callable[[str], None]
               ) -> Outcome:
        n = options.jobs or 1
        report(f"== {len(sweep.runs)} run{'s' if len(sweep.runs) > 1 else ''} of "
               f"'{sweep.stage}' as submitit's local jobs, {n} at a time; {thread_env(n)[1]}")
        return super().launch(sweep, options, report)

    def shared_submitted(self, submitted: Any, sweep: Sweep) -> None:
        """Wait for the shared stages' job: the runs start after it, or not at all."""
        try:
            while not submitted.done():
                time.sleep(POLL)
        except BaseException:
            _cancel([submitted])
            raise
        if self.result_state(submitit_module(), {"folder": str(submitted.paths.folder),
                                                  "job_id": submitted.job_id}) != "COMPLETED":
            raise CapstackError(f"the shared stages' job {submitted.job_id} failed: "
                                f"{last_error(sweep.shared_log)} (log: {typed(sweep.shared_log)}); "
                                f"no run started")

    def dispatch(self, sweep: Sweep, todo: list[Run], executor: Any, options: LaunchOptions,
                 after: str | None, outcome: Outcome, report: Callable[[str], None]) -> None:
        """At most --jobs N jobs at once, each waited for."""
        n = options.jobs or 1
        pending = deque(todo)
        running: dict[str, tuple[Run, Any, str | None]] = {}
        devices = Devices(options.devices)
        try:
            while pending or running:
                while pending and len(running) < n:
                    run = pending.popleft()
                    device = devices.take()
                    job = self.submit(sweep, run, executor, options, None, device_env(device),
                                      report)
                    running[run.label] = (run, job, device)
                time.sleep(POLL)
                for label, (run, job, device) in list(running.items()):
                    if not job.done():
                        continue
                    del running[label]
                    devices.give_back(device)
                    state = self.result_state(submitit_module(), {
                        "folder": str(job.paths.folder), "job_id": job.job_id})
                    if state == "COMPLETED":
                        outcome.done.append(label)
                        report(f"[{label}] done (job {job.job_id})")
                    else:
                        why = last_error(run.log)
                        outcome.failed.append((label, why, typed(run.log)))
                        report(f"[{label}] failed (job {job.job_id}): {why}; log {typed(run.log)}")
        except BaseException:
            report(f"stopping {len(running)} running: each stops where it can resume ...")
            _cancel([job for _, job, _ in running.values()])
            held = wait_unlocked(run for run, _, _ in running.values())
            outcome.stopped = [label for label in running]
            outcome.not_started = [run.label for run in pending]
            if held:
                report(f"still stopping: {', '.join(held)} (their stages stay locked until "
                       f"they have)")
            report(outcome.summary())
            report(outcome.rerun())
            raise

    def unended_state(self, submitit: Any, record: Mapping[str, Any]) -> str:
        """RUNNING while its process (the job's id) lives; else STOPPED."""
        try:
            os.kill(int(record["job_id"]), 0)
        except (ProcessLookupError, ValueError):
            return "STOPPED"
        except PermissionError:
            pass
        return "RUNNING"


def _cancel(jobs: list[Any]) -> None:
    """Cancel local jobs (their controllers pass the stop to each job, which stops its
    command) and wait until their processes have ended."""
    for job in jobs:
        job.cancel(check=False)
    deadline = time.monotonic() + 30
    while any(not job.done() for job in jobs) and time.monotonic() < deadline:
        time.sleep(POLL)


LAUNCHERS.register("local")(Local())
