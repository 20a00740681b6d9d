"""``slurm``: each run a SLURM job, submitted through submitit (``pip install capstack[slurm]``).

The shared stages go first, as one job; every run's job depends on it (``afterok``), so none
starts before they are done. Each job runs the run's own stages (:class:`ExperimentJob`) in
the workdir, which every node must see, so its results land where a local run writes them.
Each job is noted in its run's folder (``.capstack/jobs/``): ``capstack exp list`` says its id
and state, and the same command again skips a run whose job is still queued or running (a run
done is up to date). The command returns once the jobs are submitted.

Parameters: ``--slurm-partition``, ``--gpus-per-job`` (``gpus_per_node`` of a one-node,
one-task job), ``--time`` (minutes), any other of submitit's ``SlurmExecutor`` parameters by
its name (``--slurm cpus_per_task=8 --slurm mem=32G --slurm account=lab``); ``cpus_per_task``
is also each job's ``OMP_NUM_THREADS``. A job is checkpointable: at its time limit or a
preemption it stops its stage where it can resume and is requeued.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.core.errors import CapstackError
from pipeline.engine.launchers import LAUNCHERS, Launcher, LaunchOptions
from pipeline.engine.sweeps import (ExperimentJob, Outcome, Run, Sweep, job_records, record_job,
                                    typed, with_states)

SUBMITIT = "submitit"  # under the workdir's .capstack/: submitit's own files, a folder a job
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING",
          "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED"}  # states of a job not yet ended


def submitit_module() -> Any:
    """submitit, imported when a launcher that needs it is chosen; a CapstackError saying how
    to install it when it is missing."""
    try:
        import submitit
    except ImportError:
        raise CapstackError("--launcher local and --launcher slurm submit jobs through "
                            "submitit, which is not installed: pip install capstack[slurm] "
                            "(or pip install submitit)") from None
    return submitit


class Submitit(Launcher):
    """Each run a job of submitit's ``executor``; the shared stages first, as one job."""

    name = "slurm"
    takes = frozenset({"partition", "gpus_per_job", "time_min", "slurm"})

    def check(self, options: LaunchOptions) -> None:
        super().check(options)
        submitit_module()

    # -- the executor and its parameters ---------------------------------------------------
    def folder(self, sweep: Sweep) -> Path:
        return sweep.root.state_dir / SUBMITIT / "%j"

    def executor(self, sweep: Sweep) -> Any:
        submitit = submitit_module()
        try:
            return submitit.SlurmExecutor(folder=self.folder(sweep))
        except RuntimeError as e:  # no srun here: not a cluster's node
            raise CapstackError(f"--launcher slurm: {e} (submit from a node of the cluster; "
                                f"--launcher local runs the same jobs on this machine)") from None

    def parameters(self, options: LaunchOptions, label: str, after: str | None
                   ) -> dict[str, Any]:
        """The job's submitit parameters: one node, one task, its name, and what the options
        say (``--slurm K=V`` last, so that it can say anything)."""
        params: dict[str, Any] = {"job_name": f"capstack-{label}", "nodes": 1,
                                  "ntasks_per_node": 1}
        if options.partition:
            params["partition"] = options.partition
        if options.gpus_per_job:
            params["gpus_per_node"] = options.gpus_per_job
        if options.time_min:
            params["time"] = options.time_min
        params.update(options.slurm)
        if after is not None:
            params["dependency"] = f"afterok:{after}"
        return params

    def configure(self, executor: Any, options: LaunchOptions, label: str, after: str | None
                  ) -> None:
        try:
            executor.update_parameters(**self.parameters(options, label, after))
        except ValueError as e:  # submitit names the parameters it has
            raise CapstackError(f"--slurm: {e}") from None

    def environment(self, options: LaunchOptions) -> dict[str, str]:
        """Variables each job's command gets: its threads, where the job says its cores."""
        cpus = options.slurm.get("cpus_per_task")
        return {"OMP_NUM_THREADS": str(cpus)} if cpus else {}

    # -- submitting ------------------------------------------------------------------------
    def launch(self, sweep: Sweep, options: LaunchOptions, report: Callable[[str], None]
               ) -> Outcome:
        sweep = with_states(sweep)
        outcome = Outcome(skipped=[r.label for r in sweep.runs if r not in sweep.to_run])
        for label in outcome.skipped:
            report(f"[{label}] up to date, skipped")
        todo = []
        for run in sweep.to_run:
            queued = self.queued(run.folder, sweep.stage)
            if queued:
                report(f"[{run.label}] already submitted as job {queued[0]} ({queued[1]}), "
                       f"skipped")
                outcome.queued.append((run.label, queued[0]))
            else:
                todo.append(run)
        if todo:
            executor = self.executor(sweep)
            self.configure(executor, options, "check", None)  # refused before anything is made
            sweep.save()
            after = self.submit_shared(sweep, executor, options, report)
            self.dispatch(sweep, todo, executor, options, after, outcome, report)
        report(outcome.summary())
        if outcome.submitted or outcome.queued:
            report("`capstack exp list` says each job's state; the same command again skips "
                   "the runs done and those still queued")
        return outcome

    def dispatch(self, sweep: Sweep, todo: list[Run], executor: Any, options: LaunchOptions,
                 after: str | None, outcome: Outcome, report: Callable[[str], None]) -> None:
        """Submit every run's job, each after the shared stages' job; return at once."""
        for run in todo:
            submitted = self.submit(sweep, run, executor, options, after, {}, report)
            outcome.submitted.append((run.label, str(submitted.job_id)))

    def submit_shared(self, sweep: Sweep, executor: Any, options: LaunchOptions,
                      report: Callable[[str], None]) -> str | None:
        """Submit the shared stages as one job (or find the one still queued); its id."""
        job = sweep.shared_job(self.environment(options))
        if job is None:
            return None
        key = f"shared.{sweep.stage}"
        queued = self.queued(sweep.root.workdir, key)
        if queued:
            report(f"[shared stages] already submitted as job {queued[0]} ({queued[1]})")
            return queued[0]
        self.configure(executor, options, "shared", None)
        submitted = executor.submit(job)
        self.note(sweep.root.workdir, key, submitted, job)
        report(f"[shared stages] {', '.join(s.stage for s in sweep.shared)}: submitted as job "
               f"{submitted.job_id}; log {typed(job.log)}")
        self.shared_submitted(submitted, sweep)
        return str(submitted.job_id)

    def shared_submitted(self, submitted: Any, sweep: Sweep) -> None:
        """What follows the shared stages' submission (on a cluster: nothing, the others
        depend on it)."""

    def submit(self, sweep: Sweep, run: Run, executor: Any, options: LaunchOptions,
               after: str | None, env: Mapping[str, str], report: Callable[[str], None]
               ) -> Any:
        job = sweep.job(run, {**self.environment(options), **env})
        self.configure(executor, options, run.label, after)
        submitted = executor.submit(job)
        self.note(run.folder, sweep.stage, submitted, job)
        on = f" on GPU {env['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in env else ""
        report(f"[{run.label}] submitted as job {submitted.job_id}{on}"
               f"{f' (after job {after})' if after else ''}; log {typed(job.log)}")
        return submitted

    def note(self, folder: Path, stage: str, submitted: Any, job: ExperimentJob) -> None:
        record_job(folder, stage, {
            "launcher": self.name, "job_id": str(submitted.job_id), "stage": stage,
            "folder": str(submitted.paths.folder), "log": job.log,
            "submitted": time.strftime("%Y-%m-%dT%H:%M:%S")})

    # -- a job's state -----------------------------------------------------------------------
    def queued(self, folder: Path, stage: str) -> tuple[str, str] | None:
        """(job id, state) of the job noted for ``stage`` in ``folder`` while it has not ended."""
        for record in job_records(folder):
            if record["stage"] == stage and record["launcher"] == self.name:
                state = self.job_state(record)
                if state.split()[0] in ACTIVE:
                    return str(record["job_id"]), state
        return None

    def job_state(self, record: Mapping[str, Any]) -> str:
        """COMPLETED or FAILED once the job wrote its result, else :meth:`unended_state`."""
        try:
            submitit = submitit_module()
        except CapstackError:
            return "unknown (submitit is not installed)"
        return self.result_state(submitit, record) or self.unended_state(submitit, record)

    def unended_state(self, submitit: Any, record: Mapping[str, Any]) -> str:
        """The state of a job that has written no result: what the cluster says (``sacct``:
        PENDING, RUNNING, ...)."""
        job = submitit.SlurmJob(folder=Path(record["folder"]).parent / "%j",
                                job_id=str(record["job_id"]))
        return str(job.state)

    @staticmethod
    def result_state(submitit: Any, record: Mapping[str, Any]) -> str | None:
        paths = submitit.core.utils.JobPaths(Path(record["folder"]), str(record["job_id"]), 0)
        if not paths.result_pickle.exists():
            return None
        try:
            outcome, _ = submitit.core.utils.pickle_load(paths.result_pickle)
        except Exception:  # noqa: BLE001 - a result being written, or damaged: not yet said
            return None
        return "COMPLETED" if outcome == "success" else "FAILED"


class Slurm(Submitit):
    """Each run a SLURM job through submitit (pip install capstack[slurm]), after one job of
    the shared stages; returns once they are submitted (`capstack exp list`: their states)."""


LAUNCHERS.register("slurm")(Slurm())
