"""Every old form the trainer still reads, in one place: experiment files, ``--set`` overrides,
checkpoints and run folders saved by an earlier capstack, each brought to today's form once,
when it is loaded.

trainer/config.py keeps today's schema and its reader; trainer/checkpoint.py today's format;
trainer/runs.py today's run record. Their loaders call this module once per load
(``load_experiment``: :func:`experiment_file` and :func:`override`; ``load_checkpoint``:
:func:`checkpoint`, and :func:`old_checkpoint_fields` for the fields it checks first; a
resume's ``config.json``: :func:`saved_experiment`; ``capstack runs``: :func:`older_run`,
:func:`older_evaluations`), and nothing else in trainer/ reads an old form. pipeline/, which
never imports the trainer, reads its own old forms where they are loaded: a store's first
metadata in pipeline/features/stores/schema.py (``upgrade_meta``).

This module imports no torch at its top (the registries it reads are imported where they are
needed): ``capstack runs`` lists runs through it without loading torch.

What is read, and how:

- the flat experiment of the first format (``decoder: NAME``, ``decoder_config``, the
  objective's settings under ``train``): refused in a file, with the same experiment written
  in today's form (:func:`refuse_old_form`); converted in a first-format checkpoint
  (:func:`new_form`, :func:`first_format_checkpoint`);
- keys whose settings moved, read in their places with a FutureWarning where the file should
  be rewritten (:func:`read_old_keys`): ``objective.cider_cache`` (a reward component now),
  ``train.betas`` / ``train.weight_decay`` (the optimiser's), ``data.bucket_by_length``
  (``data.batching``), ``train.amp: BOOL`` (a precision);
- the same as ``--set`` overrides (:func:`override`);
- a checkpoint's decoder identity saved before a decoder setting existed: the setting at its
  default, which is what that run did (:func:`with_new_decoder_settings`); its table labels
  when it was saved before checkpoints recorded them; the run's fields added since
  (:func:`with_run_fields`: the kept score, the precision's state, the start, the epoch's loss);
- a run trained before runs kept ``state.json``: its ``summary.json`` or its log's validations,
  whose epochs counted from 0 (:func:`older_run`); its evaluation in ``<run>/eval/``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import yaml

from pipeline.core.errors import CapstackError
from pipeline.core.regular import read_text
from trainer.run_fields import epoch_number, finite_score, is_int, is_number, pick, read_json_for

FIRST_FORMAT = "capstack-checkpoint-1"  # flat experiment: decoder_config, train.objective
OLD_FORMATS = (FIRST_FORMAT,)  # the format tags of checkpoints still read besides today's


def experiment_file(data: dict, where: str) -> dict:
    """An experiment file's mapping in today's form: the flat form refused (with its
    rewrite), moved keys read in their places."""
    refuse_old_form(data, where)
    return read_old_keys(data, where)


def override(item: str) -> list[str]:
    """A ``--set KEY=VALUE`` as the overrides it means today (a moved key in its place, with a
    warning); a key of the flat form refused, naming today's."""
    refuse_old_override(item)
    return old_reward_override(old_optimizer_override(item))


def saved_experiment(data, where: str):
    """The experiment a run saved (its ``config.json``) in today's form: the flat form
    converted, moved keys read in their places (what is no mapping as it is: the schema
    refuses it)."""
    return read_old_keys(new_form(data), where) if isinstance(data, dict) else data


def checkpoint(payload: dict) -> dict:
    """A checkpoint payload (read and verified) in today's form: a first-format one converted,
    its experiment's moved keys in their places, its decoder identity with the settings added
    since, its table labels."""
    from trainer.objectives import table_labels_of  # torch: here, not at the top

    if payload.get("format") == FIRST_FORMAT:
        payload = first_format_checkpoint(payload)
    payload["identity"] = with_new_decoder_settings(payload["identity"])
    payload["experiment"] = read_old_keys(payload["experiment"], payload["path"])
    if not isinstance(payload.get("table"), dict):  # saved before checkpoints said it
        payload["table"] = table_labels_of(payload["experiment"])
    return with_run_fields(payload)


# ------------------------------------------------------------------------- the flat form

OLD_TRAIN_KEYS = {  # train.<key> of the flat form -> its place in the objective section
    "objective": "name", "cider_cache": "cider_cache", "scst_samples": "samples",
    "scst_baseline": "baseline", "c2f_coarse_term": "coarse_term",
    "scheduled_sampling_start": "scheduled_sampling_start",
    "scheduled_sampling_increase_every": "scheduled_sampling_increase_every",
    "scheduled_sampling_increase": "scheduled_sampling_increase",
    "scheduled_sampling_max": "scheduled_sampling_max",
}


def new_form(data: dict) -> dict:
    """An experiment of the flat form (``decoder: NAME``, ``decoder_config``, the objective's
    settings under ``train``) in the form of components; unchanged when already new."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    if isinstance(data.get("decoder"), str) or "decoder_config" in data:
        name = data.get("decoder")
        data["decoder"] = {"name": name, **(data.pop("decoder_config", None) or {})}
    section = data.get("train")
    train: dict = section if isinstance(section, dict) else {}
    moved = {new: train.pop(old) for old, new in OLD_TRAIN_KEYS.items() if old in train}
    if moved:
        from trainer.objectives import OBJECTIVES  # torch: here, not at the top

        name = moved.pop("name", "xe")
        known = {f.name for f in dataclasses.fields(OBJECTIVES.get(name).Config)}
        if "reward" in known and "cider_cache" in moved:  # in its place
            moved = {("reward" if k == "cider_cache" else k):
                     ({"name": "cider-d", "cache": v} if k == "cider_cache" else v)
                     for k, v in moved.items()}
        data["objective"] = {"name": name, **{k: v for k, v in moved.items() if k in known}}
    order = ["name", "decoder", "objective", "data", "train", "eval"]
    return {k: data[k] for k in order if k in data} | {k: v for k, v in data.items()
                                                       if k not in order}


def refuse_old_form(data: dict, where: str) -> None:
    """An experiment file of the flat form is refused, with the same experiment in the new form."""
    old = [k for k in ("decoder_config",) if k in data]
    old += ["decoder"] if isinstance(data.get("decoder"), str) else []
    section = data.get("train")
    train: dict = section if isinstance(section, dict) else {}
    old += [f"train.{k}" for k in OLD_TRAIN_KEYS if k in train]
    if not old:
        return
    shown = yaml.safe_dump(new_form(data), sort_keys=False, default_flow_style=None, width=100)
    raise CapstackError(f"{where}: {', '.join(old)}: the old form of an experiment file; "
                        f"decoder and objective are components now, each a mapping with its "
                        f"name. Write it as:\n\n{shown}")


def refuse_old_override(item: str) -> None:
    key = item.partition("=")[0]
    section, _, rest = key.partition(".")
    if section == "train" and rest == "cider_cache":
        raise CapstackError(f"--set {item}: {key} is objective.reward now (the objective is its "
                            f"own section, the reward a component of it: --set 'objective.reward="
                            f"{{name: cider-d, cache: {item.partition('=')[2]}}}')")
    if section == "train" and rest in OLD_TRAIN_KEYS:
        raise CapstackError(f"--set {item}: {key} is objective.{OLD_TRAIN_KEYS[rest]} now (the "
                            f"objective is its own section: --set objective.{OLD_TRAIN_KEYS[rest]}"
                            f"={item.partition('=')[2]}, or a whole section: --set 'objective="
                            f"{{name: scst, reward: {{name: cider-d, cache: FILE}}}}')")
    if section == "decoder_config":
        raise CapstackError(f"--set {item}: decoder_config.{rest} is decoder.{rest} now "
                            f"(--set decoder.{rest}={item.partition('=')[2]})")


# ------------------------------------------------------------------------- the reward's old key

OLD_REWARD = ("objective.cider_cache is objective.reward: {name: cider-d, cache: FILE} now "
              "(read as that; write the reward so)")


def warn_old_reward() -> None:
    """The one warning of the old key: shown once per process (Python's default filter for a
    FutureWarning of the same text from the same line)."""
    warnings.warn(OLD_REWARD, FutureWarning, stacklevel=2)


def read_old_reward(data: dict, where: str) -> dict:
    """``objective.cider_cache: FILE``, from before rewards were components, as
    ``objective.reward: {name: cider-d, cache: FILE}`` in its place, with a warning: read, not
    refused, since stages files' ``--set`` and checkpoints in the wild carry it."""
    objective = data.get("objective")
    if not isinstance(objective, dict) or "cider_cache" not in objective:
        return data
    if "reward" in objective:
        raise CapstackError(f"{where}: objective.cider_cache: objective.reward names the reward "
                            f"already; drop cider_cache (the old form of reward: {{name: "
                            f"cider-d, cache: FILE}})")
    warn_old_reward()
    reward = {"name": "cider-d", "cache": objective["cider_cache"]}
    return {**data, "objective": {("reward" if k == "cider_cache" else k):
                                  (reward if k == "cider_cache" else v)
                                  for k, v in objective.items()}}


# ------------------------------------------------------------------------- the optimiser's old keys

OLD_OPTIMIZER_KEYS = ("betas", "weight_decay")  # train.<key> -> train.optimizer.<key> (Adam's)
OLD_OPTIMIZER = ("train.betas and train.weight_decay are train.optimizer.betas and "
                 "train.optimizer.weight_decay now, the settings of train.optimizer: {name: adam} "
                 "(read as that; write them so)")


def read_old_optimizer(data: dict, where: str) -> dict:
    """``train.betas`` / ``train.weight_decay``, Adam's settings from before the optimiser was
    a component, as ``train.optimizer: {name: adam, ...}``, with a warning (experiment files
    and checkpoints carry them). Beside a ``train.optimizer`` they are refused."""
    train = data.get("train")
    if not isinstance(train, dict) or not any(k in train for k in OLD_OPTIMIZER_KEYS):
        return data
    old = {k: train[k] for k in OLD_OPTIMIZER_KEYS if k in train}
    if "optimizer" in train:
        raise CapstackError(f"{where}: train.{next(iter(old))}: train.optimizer names the "
                            f"optimiser already; give its settings there")
    warnings.warn(OLD_OPTIMIZER, FutureWarning, stacklevel=2)
    kept = {k: v for k, v in train.items() if k not in OLD_OPTIMIZER_KEYS}
    return {**data, "train": {**kept, "optimizer": {"name": "adam", **old}}}


def old_optimizer_override(item: str) -> str:
    """``train.betas=...`` as ``train.optimizer.betas=...``, with a warning."""
    key, _, value = item.partition("=")
    section, _, rest = key.partition(".")
    if section != "train" or rest not in OLD_OPTIMIZER_KEYS:
        return item
    warnings.warn(OLD_OPTIMIZER, FutureWarning, stacklevel=2)
    return f"train.optimizer.{rest}={value}"


# ------------------------------------------------------------------------- batching's old key

OLD_BATCHING = ("data.bucket_by_length is data.batching now: length_buckets for true, images "
                "for false (read as that; write it so)")


def read_old_batching(data: dict, where: str) -> dict:
    """``data.bucket_by_length: BOOL``, from before batching had three kinds, as
    ``data.batching``: silently when false (what every checkpoint of then says), with a
    warning when true."""
    section = data.get("data")
    if not isinstance(section, dict) or "bucket_by_length" not in section:
        return data
    bucket = section["bucket_by_length"]
    if "batching" in section:
        raise CapstackError(f"{where}: data.bucket_by_length: data.batching says how batches "
                            f"are made already; drop bucket_by_length")
    if bucket:
        warnings.warn(OLD_BATCHING, FutureWarning, stacklevel=2)
    kept = {k: v for k, v in section.items() if k != "bucket_by_length"}
    return {**data, "data": {**kept, "batching": "length_buckets" if bucket is True else
                             "images" if bucket is False else bucket}}


def read_old_amp(data: dict) -> dict:
    """``train.amp: BOOL``, from before autocast had a precision, as ``auto`` or ``off``."""
    section = data.get("train")
    if not isinstance(section, dict) or not isinstance(section.get("amp"), bool):
        return data
    return {**data, "train": {**section, "amp": "auto" if section["amp"] else "off"}}


def old_reward_override(item: str) -> list[str]:
    """``objective.cider_cache=FILE`` as the overrides it means now, with a warning:
    ``objective.reward.name=cider-d`` (another reward's settings dropped, a cider-d's kept),
    then ``objective.reward.cache=FILE``. Any other override as it is."""
    key, _, value = item.partition("=")
    if key != "objective.cider_cache":
        return [item]
    warn_old_reward()
    return ["objective.reward.name=cider-d", f"objective.reward.cache={value}"]


def read_old_keys(data: dict, where: str) -> dict:
    """Keys an experiment had before their settings moved, in their places now."""
    return read_old_amp(read_old_batching(read_old_optimizer(read_old_reward(data, where), where),
                                          where))


# ------------------------------------------------------------------------- checkpoints

def old_checkpoint_fields(payload: dict) -> list[tuple[str, type, bool]] | None:
    """The fields a checkpoint of an older format holds where today's form has others, as
    trainer/checkpoint.py's check_form checks them (``field``, its type, whether required):
    the first format's decoder a name beside its ``decoder_config``. None: today's format."""
    if payload.get("format") != FIRST_FORMAT:
        return None
    return [("identity.decoder", str, True), ("identity.decoder_config", dict, True),
            ("experiment.decoder_config", dict, False)]


def first_format_checkpoint(payload: dict) -> dict:
    """A first-format checkpoint in today's form: the experiment's components, the identity's
    decoder as one mapping, no objective state (no objective owned any then)."""
    old = payload["identity"]
    payload["experiment"] = new_form(payload["experiment"])
    payload["identity"] = {"decoder": {"name": old["decoder"], **old["decoder_config"]},
                           "vocab": old["vocab"],
                           "stores": [{"fingerprint": s["fingerprint"]} for s in old["stores"]]}
    payload.setdefault("objective", {"modules": {}, "optimizers": {}, "extra": {}})
    return payload


def with_run_fields(payload: dict) -> dict:
    """A run's fields added to checkpoints since the first, as a run saved without them had
    them: the score best.pt was kept on (CIDEr, before ``train.select_on``), no precision's
    state (before ``train.amp``), no start digest (before ``train.init_from`` was checked on
    resume), and no loss of the epoch so far (before runs kept it: a resumed epoch's mean is
    then of the steps run from the checkpoint)."""
    payload.setdefault("best_score", payload["best_cider"])
    payload.setdefault("precision", {})
    payload.setdefault("start", None)
    payload.setdefault("epoch_loss", [0.0, 0])
    return payload


def with_new_decoder_settings(saved: dict) -> dict:
    """The identity with each decoder setting added since it was saved, at its default.

    A decoder's new setting defaults to what the decoder did before it (top_down's
    ``att_activation: tanh``), so that is what the saved run had: without this, its identity
    would differ from the one its own experiment now reads as, and every command would refuse
    it (``decoder.att_activation: the checkpoint has None, this run has 'tanh'``)."""
    from trainer.decoders import DECODERS  # torch: here, not at the top

    decoder = saved["decoder"]
    if decoder.get("name") not in DECODERS:
        return saved  # check_contents names the unknown decoder
    defaults = {f.name: f.default for f in dataclasses.fields(DECODERS.get(decoder["name"]).Config)
                if f.default is not dataclasses.MISSING}
    return {**saved, "decoder": {**decoder, **{k: v for k, v in defaults.items()
                                               if k not in decoder}}}


# ------------------------------------------------------------------------- run folders

OLDER_EVALUATION = "eval"  # <run>/eval/: where `capstack evaluate RUN` wrote by default before


def older_evaluations(folder: Path) -> list[Path]:
    """The metrics files an evaluation of the run in ``folder`` left where evaluate wrote them
    before it wrote ``evals/NAME/``."""
    return [folder / OLDER_EVALUATION / "metrics.json"]


def older_run(folder: Path, planned: int | None, notes: list[str]) -> dict:
    """A run trained before runs kept ``state.json``, as ``capstack runs`` shows a run (the
    fields of trainer/runs.py's RunRow it can say; what is damaged appended to ``notes``): its
    ``summary.json`` (written when it finished; those capstacks counted its ``best_epoch``
    from 0, -1 the start, where ``summary.json`` now counts as ``state.json`` does) or the
    validations of its ``metrics.jsonl``. ``planned``: the epochs its config asks."""
    summary_path = folder / "summary.json"
    if summary_path.exists():
        summary = read_json_for(summary_path, notes, "run summary")
        if summary is not None:
            row: dict = {"epochs_done": pick(summary, "epochs", int, summary_path, notes)}
            if summary.get("best_cider") is not None:
                row["best_cider"] = finite_score(summary, "best_cider", summary_path, notes)
                best_epoch = epoch_number(summary, "best_epoch", -1, summary_path, notes)
                row["best_epoch"] = None if best_epoch is None else best_epoch + 1
            done = row["epochs_done"]
            row["state"] = "finished" if done is not None and (planned is None or
                                                               done >= planned) else "stopped"
            return row
    if not (folder / "metrics.jsonl").exists():
        return {}  # no training to read: what is there (a config) said what it could
    vals = validations(folder / "metrics.jsonl", notes)
    row = {"epochs_done": len({epoch for epoch, _ in vals if epoch >= 0})}
    scored = [(cider, -epoch) for epoch, cider in vals if math.isfinite(cider)]
    if scored:  # a NaN validation is never the best; of equal scores the first
        cider, epoch = max(scored)
        row["best_cider"], row["best_epoch"] = cider, 1 - epoch
    row["state"] = "stopped"
    notes.append("no end state recorded (trained by a capstack that kept none)")
    return row


def validations(path: Path, notes: list[str]) -> list[tuple[int, float]]:
    """(epoch, CIDEr) of each validation in a training log, its epochs counted from 0 (-1 the
    start); a bad line is noted, not fatal."""
    try:
        lines = read_text(path, "a training log").splitlines()
    except FileNotFoundError:
        return []
    except CapstackError as error:  # not a regular file: never read
        notes.append(str(error))
        return []
    except (OSError, UnicodeDecodeError) as error:
        notes.append(f"{path}: cannot read ({error})")
        return []
    found = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            notes.append(f"{path}: line {number} is not a log entry")
            break
        if entry.get("kind") != "val":
            continue
        epoch, cider = entry.get("epoch"), entry.get("cider")
        if not is_int(epoch) or epoch < -1 or not is_number(cider):
            notes.append(f"{path}: line {number}: a validation of epoch {epoch!r} scored "
                         f"{cider!r} (expected an epoch from -1 and a number)")
            break
        found.append((epoch, float(cider)))
    return found
