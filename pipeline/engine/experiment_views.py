"""What ``capstack exp list|show|diff`` print: each experiment's settings against the
baseline's, the state of its own stages, and the metrics its own evaluations wrote.

An evaluation is any out folder of a stage holding ``metrics.json`` (what ``capstack evaluate``
writes): its ``metrics`` are read, nothing else, so the views know no metric or objective.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline.core.regular import NotRegular, read_text
from pipeline.core.runlock import holder_now
from pipeline.engine.experiments import Experiment, ExperimentPipeline, run_lock
from pipeline.engine.stages import NEVER_RUN, UP_TO_DATE, Pipeline

SHOWN_METRICS = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr")  # exp show's and exp diff's metrics
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


def evaluations(pipeline: Pipeline, stages: frozenset[str] | None = None) -> dict[str, dict]:
    """``stage name -> metrics`` for each stage (of ``stages``, default all) with an out folder
    holding a readable metrics.json."""
    found = {}
    for name in pipeline.file.order:
        if stages is not None and name not in stages:
            continue
        for out in pipeline.file.stages[name].outs:
            metrics = read_metrics(pipeline.workdir / out / "metrics.json")
            if metrics is not None:
                found[name] = metrics
    return found


def read_metrics(path: Path) -> dict | None:
    try:
        doc = json.loads(read_text(path, "an evaluation's metrics"))
    except (OSError, ValueError, NotRegular):
        return None
    metrics = doc.get("metrics") if isinstance(doc, dict) else None
    return metrics if isinstance(metrics, dict) else None


def percent(value: Any) -> str:
    return f"{100 * value:.1f}" if isinstance(value, (int, float)) else "-"


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
    """``exp show``: one row per evaluation an experiment has of its own, after the baseline's
    row for the same stage: the value of each param an experiment sets (a column each), as
    each has it, the stage's state, its metrics in percent. A group's seeds follow it."""
    pipelines = sorted(pipelines, key=lambda p: (p.experiment.group,
                                                 p.experiment.name != p.experiment.group,
                                                 p.experiment.name))
    keys = list(dict.fromkeys(k for p in pipelines for k in p.experiment.params))
    roots = list(dict.fromkeys(r for p in pipelines for r in p.experiment.roots))
    rows = [["experiment", "evaluation", *keys, "state", *SHOWN_METRICS]]
    baseline_states, baseline_metrics = states_now(baseline), evaluations(baseline)
    seen = [(p, states_now(p), evaluations(p, p.own)) for p in pipelines]
    for stage in baseline.file.order:
        shown = [(p, states, own) for p, states, own in seen
                 if stage in p.own and (stage in own or _is_evaluation(p, stage)
                                        and states[stage] != NEVER_RUN)]
        if shown:
            rows.append([BASELINE, stage, *effective_values(baseline, stage, keys, roots),
                         baseline_states[stage],
                         *(percent(baseline_metrics.get(stage, {}).get(m)) for m in SHOWN_METRICS)])
        for p, states, own in shown:
            rows.append([p.experiment.name, stage, *effective_values(p, stage, keys, roots),
                         states[stage],
                         *(percent(own.get(stage, {}).get(m)) for m in SHOWN_METRICS)])
    return rows


def effective_values(pipeline: Pipeline, stage: str, keys: list[str], roots: list[str]
                     ) -> list[str]:
    """Each param ``key`` as ``pipeline`` runs ``stage``: its value on the first of ``roots``
    that is the stage or upstream of it and has the param ("" where none does)."""
    upstream = {stage, *pipeline.upstream_closure(stage)}
    stages = pipeline.file.stages
    return [next((str(stages[r].params[k]) for r in roots
                  if r in upstream and k in stages[r].params), "") for k in keys]


def _is_evaluation(pipeline: Pipeline, stage: str) -> bool:
    """A stage that runs ``capstack evaluate`` (its metrics may not be written yet)."""
    return pipeline.file.stages[stage].command == "evaluate"


def diff(baseline: Pipeline, a: ExperimentPipeline, b: ExperimentPipeline | None
         ) -> list[list[str]]:
    """``exp diff A [B]``: each param set differently (B: the baseline when not given), then
    each evaluation both have, metric by metric; a value of an evaluation that is not up to
    date says its state (``41.0 (stale)``): its metrics are of other settings, or other
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
        for m in SHOWN_METRICS:
            va, vb = metrics_a[stage].get(m), metrics_b[stage].get(m)
            if va is not None and vb is not None and va != vb:
                rows.append([f"{stage} {m}", _as_of(va, states_a[stage]),
                             _as_of(vb, states_b[stage])])
    return rows


def _as_of(value: Any, state: str) -> str:
    """A metric in percent, with its evaluation's state when it is not up to date."""
    return percent(value) if state == UP_TO_DATE else f"{percent(value)} ({state})"
