"""What ``capstack exp list|show|diff`` print: each experiment's settings against the
baseline's, the state of its own stages, and the numbers its own stages wrote in the metrics
files they declare (a stage's ``metrics:``: stagedecl.MetricsFile). Only those files are read,
and only the values they name (every top-level number where they name none), so the views
know no metric, no objective and no command.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from pipeline.core.regular import NotRegular, read_text
from pipeline.core.runlock import holder_now
from pipeline.engine.experiments import Experiment, ExperimentPipeline, run_lock
from pipeline.engine.stagedecl import MetricsFile, column_of
from pipeline.engine.stages import NEVER_RUN, UP_TO_DATE, Pipeline

BASELINE = "baseline"
RUNNING = "running"


def baseline_values(baseline: Pipeline, experiment: Experiment) -> dict[str, Any]:
    """Each param the experiment sets, as the baseline has it on the first root that has it."""
    values: dict[str, Any] = {}
    for root in experiment.roots:
        stage = baseline.file.stages.get(root)
        for k in experiment.params:
            if stage is not None and k in stage.params and k not in values:
                values[k] = stage.params[k]
    return values


def states_now(pipeline: Pipeline) -> dict[str, str]:
    """Each stage's state: ``running`` while its run lock is held (its record is written only
    when it ends, so until then its record says never run, or stale), else its status's."""
    return {name: RUNNING if holder_now(run_lock(pipeline, name)) else status.state
            for name, status in pipeline.statuses().items()}


def own_state(pipeline: ExperimentPipeline) -> str:
    """How many of the experiment's own stages are up to date, stale, never run, running."""
    states = states_now(pipeline)
    counts = Counter(states[name] for name in pipeline.file.order if name in pipeline.own)
    return ", ".join(f"{n} {state}" for state, n in counts.items()) or "no stage of its own"


class Number(NamedTuple):
    """A value of a metrics file as a view shows it: times 100 where its entry says percent."""

    value: float
    percent: bool = False

    def __str__(self) -> str:
        if self.percent:
            return f"{100 * self.value:.1f}"
        return str(self.value) if isinstance(self.value, int) else f"{self.value:.4g}"


def evaluations(pipeline: Pipeline, stages: frozenset[str] | None = None
                ) -> dict[str, dict[str, Number]]:
    """``stage name -> column -> number`` for each stage (of ``stages``, default all) that
    declares metrics files and has one readable."""
    found = {}
    for name in pipeline.file.order:
        if stages is not None and name not in stages:
            continue
        numbers: dict[str, Number] = {}
        for metrics in pipeline.file.stages[name].metrics:
            numbers.update(read_numbers(pipeline.workdir / metrics.path, metrics) or {})
        if numbers:
            found[name] = numbers
    return found


def read_numbers(path: Path, metrics: MetricsFile) -> dict[str, Number] | None:
    """The numbers of a metrics file (a JSON mapping) that its entry shows, by column; None
    when it cannot be read (not written yet, or damaged)."""
    try:
        doc = json.loads(read_text(path, "a metrics file"))
    except (OSError, ValueError, NotRegular):
        return None
    if not isinstance(doc, dict):
        return None
    keys = metrics.show or [k for k in doc if _is_number(doc[k])]
    found = {}
    for key in keys:
        value = _value_at(doc, key)
        if _is_number(value):
            found[column_of(key) if metrics.show else key] = Number(value, metrics.percent)
    return found


def _value_at(doc: Any, key: str) -> Any:
    """``doc[key]``, a dot going into a mapping (``metrics.CIDEr``) where no key holds it."""
    if not isinstance(doc, dict):
        return None
    if key in doc:
        return doc[key]
    head, dot, rest = key.partition(".")
    while dot:
        if head in doc:
            return _value_at(doc[head], rest)
        more, dot, rest = rest.partition(".")
        head = f"{head}.{more}"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(number: Number | None) -> str:
    return "-" if number is None else str(number)


def declared_columns(pipeline: Pipeline, stage: str) -> list[str]:
    """The columns a stage's metrics entries name (none for an entry that shows every
    number: its columns are those its file holds)."""
    return [column_of(key) for metrics in pipeline.file.stages[stage].metrics
            for key in metrics.show]


def settings_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "(baseline's)"


def listing(baseline: Pipeline, pipelines: list[ExperimentPipeline]) -> list[list[str]]:
    """``exp list``: one row per experiment: its settings (baseline's value first), the state
    of its own stages, its roots, when it was made, and, when a launcher submitted one of its
    stages as a job (``--launcher slurm``), the job's id and state."""
    rows = [["experiment", "settings (baseline -> experiment)", "own stages", "set on", "made"]]
    jobs = [jobs_text(p.workdir) for p in pipelines]
    for p in pipelines:
        was = baseline_values(baseline, p.experiment)
        settings = " ".join(f"{k}: {was.get(k, '?')} -> {v}"
                            for k, v in p.experiment.params.items())
        rows.append([p.experiment.name, settings, own_state(p), ", ".join(p.experiment.roots),
                     p.experiment.created])
    if any(jobs):
        rows[0].append("job")
        for row, text in zip(rows[1:], jobs):
            row.append(text or "-")
    return rows


def jobs_text(folder: Path) -> str:
    """The jobs submitted to run stages in ``folder``: ``slurm 4242 RUNNING`` (its stage
    named when the folder has several)."""
    from pipeline.engine.launchers import LAUNCHERS
    from pipeline.engine.sweeps import job_records

    records = list(job_records(folder))
    said = []
    for record in records:
        launcher = LAUNCHERS.get(record["launcher"]) if record["launcher"] in LAUNCHERS else None
        state = launcher.job_state(record) if launcher is not None else "unknown"
        stage = f" ({record['stage']})" if len(records) > 1 else ""
        said.append(f"{record['launcher']} {record['job_id']} {state}{stage}")
    return "; ".join(said)


def show(baseline: Pipeline, pipelines: list[ExperimentPipeline]) -> list[list[str]]:
    """``exp show``: one row per stage declaring metrics that an experiment has of its own
    (run, or running), after the baseline's row for the same stage: the value of each param an
    experiment sets (a column each), as each has it, the stage's state, and the numbers of its
    metrics files (a column each). A group's seeds follow it."""
    pipelines = sorted(pipelines, key=lambda p: (p.experiment.group,
                                                 p.experiment.name != p.experiment.group,
                                                 p.experiment.name))
    keys = list(dict.fromkeys(k for p in pipelines for k in p.experiment.params))
    roots = list(dict.fromkeys(r for p in pipelines for r in p.experiment.roots))
    found = []  # (experiment, stage, its settings' values, state, numbers) a row each
    baseline_states, baseline_metrics = states_now(baseline), evaluations(baseline)
    seen = [(p, states_now(p), evaluations(p, p.own)) for p in pipelines]
    for stage in baseline.file.order:
        rows = [(p, states, own) for p, states, own in seen
                if stage in p.own and baseline.file.stages[stage].metrics
                and (stage in own or states[stage] != NEVER_RUN)]
        if rows:
            found.append((BASELINE, stage, effective_values(baseline, stage, keys, roots),
                          baseline_states[stage], baseline_metrics.get(stage, {})))
        found += [(p.experiment.name, stage, effective_values(p, stage, keys, roots),
                   states[stage], own.get(stage, {})) for p, states, own in rows]
    columns = list(dict.fromkeys([*(c for _, stage, *_ in found
                                    for c in declared_columns(baseline, stage)),
                                  *(c for *_, numbers in found for c in numbers)]))
    return [["experiment", "evaluation", *keys, "state", *columns],
            *([name, stage, *values, state, *(shown(numbers.get(c)) for c in columns)]
              for name, stage, values, state, numbers in found)]


def effective_values(pipeline: Pipeline, stage: str, keys: list[str], roots: list[str]
                     ) -> list[str]:
    """Each param ``key`` as ``pipeline`` runs ``stage``: its value on the first of ``roots``
    that is the stage or upstream of it and has the param ("" where none does)."""
    upstream = {stage, *pipeline.upstream_closure(stage)}
    stages = pipeline.file.stages
    return [next((str(stages[r].params[k]) for r in roots
                  if r in upstream and k in stages[r].params), "") for k in keys]


def diff(baseline: Pipeline, a: ExperimentPipeline, b: ExperimentPipeline | None
         ) -> list[list[str]]:
    """``exp diff A [B]``: each param set differently (B: the baseline when not given), then
    each number of the metrics files both have that differs; a value of a stage that is not up
    to date says its state (``41.0 (stale)``): its metrics are of other settings, or other
    code."""
    name_b = b.experiment.name if b else BASELINE
    rows = [["", a.experiment.name, name_b]]
    was = {**baseline_values(baseline, a.experiment),
           **(baseline_values(baseline, b.experiment) if b else {})}
    values_a = {**was, **a.experiment.params}
    values_b = {**was, **(b.experiment.params if b else {})}
    for k in dict.fromkeys([*values_a, *values_b]):
        if str(values_a.get(k)) != str(values_b.get(k)):
            rows.append([k, str(values_a.get(k, "-")), str(values_b.get(k, "-"))])
    side_b = b or baseline
    metrics_a, metrics_b = evaluations(a), evaluations(side_b)
    states_a, states_b = states_now(a), states_now(side_b)
    for stage in [s for s in metrics_a if s in metrics_b]:
        for m in metrics_a[stage]:
            va, vb = metrics_a[stage][m], metrics_b[stage].get(m)
            if vb is not None and va.value != vb.value:
                rows.append([f"{stage} {m}", _as_of(va, states_a[stage]),
                             _as_of(vb, states_b[stage])])
    return rows


def _as_of(number: Number, state: str) -> str:
    """A number, with its stage's state when it is not up to date."""
    return str(number) if state == UP_TO_DATE else f"{number} ({state})"
