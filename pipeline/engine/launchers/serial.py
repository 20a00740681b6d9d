"""``serial``: the runs one after another, in this process, as ``capstack run`` always ran them;
the first that fails stops the sweep."""

from __future__ import annotations

from typing import Callable

from pipeline.engine.experiments import running_in
from pipeline.engine.launchers import LAUNCHERS, Launcher, LaunchOptions
from pipeline.engine.sweeps import Outcome, Sweep


class Serial(Launcher):
    """One run after another, in this process; the first that fails stops the others."""

    name = "serial"

    def launch(self, sweep: Sweep, options: LaunchOptions, report: Callable[[str], None]
               ) -> Outcome:
        outcome = Outcome()
        for run in sweep.runs:
            if len(sweep.runs) > 1 or run.experiment is not None:  # where each run's outs go
                report("== baseline" if run.experiment is None else
                       f"== experiment {run.label}: "
                       f"{run.folder.relative_to(sweep.root.workdir)}/")
            with running_in(run.experiment):
                ran = run.pipeline.run(sweep.stage, force=sweep.force, with_deps=sweep.with_deps,
                                       report=report)
            (outcome.done if ran else outcome.skipped).append(run.label)
        return outcome


LAUNCHERS.register("serial")(Serial())
