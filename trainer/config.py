"""Experiment configuration: yaml -> dataclasses, strictly (an unknown key or a wrong type is an
error).

An experiment file names its components, each a mapping whose ``name`` picks a
registered class and whose other keys fill that class's own config dataclass::

    name: soft_attention
    decoder: {name: soft_attention, hidden: 512, att_hidden: 512}
    objective: {name: xe}        # or {name: scst, samples: 5, reward: {name: cider-d, cache: ...}}
    data: {captions: data/prepared, features: [data/features/grid.json]}
    train: {epochs: 10, batch_size: 50, lr: 4.0e-4}  # optimizer: {name: adam} unless given
    eval: {beam_size: 5}  # or {search: diverse, group_size: 2}: trainer/decoding/options.py

Everything is checked when the file is read, before a store or a model is
opened: types, choices, each component's own checks, and whether the objective
can train the decoder. ``--set train.epochs=3`` or ``--set objective.baseline=mean``
overrides one value; a mapping (``--set 'train={epochs: 3, lr: 1e-4}'``) is laid over the
section, as ``extends`` lays a file over another. Another component's name starts its
section afresh (the settings of the one it replaces would not fit): ``--set objective.name=scst
--set 'objective.reward={name: cider-d, cache: c.npz}'`` turns any experiment into
SCST. A component's config may hold components of its own (SCST's ``reward``, a
mix's ``parts``): a field declared with ``component(REGISTRY)`` is read the same
way wherever it sits, and ``--set objective.reward.name=bleu`` starts that one
afresh too. Errors read ``FILE: section.key: problem``.

Older forms (the flat experiment, keys whose settings moved, such as
``objective.cider_cache`` or ``train.betas``) are read, or refused with their rewrite, by
trainer/upgrade.py, once, when the file is loaded; this module knows today's form only.

Every number of a config has a declared :class:`Bound` (``bounded(default, low,
high)``), checked when the file is read: a whole number lies from ``low`` to
``high``, a float is finite and within its ends (``train.lr: must be a finite
number above 0, got nan``), before torch or numpy meets it. Decoders bound
theirs generically (``DecoderConfig.check``). A config's ``check()`` says the
rules between fields.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Literal

import yaml

from pipeline.core.errors import CapstackError, not_utf8, shown, too_deep
from pipeline.core.regular import read_text
from pipeline.core.yamlfile import check_expanded

from trainer.bounds import (MAX_BATCH, MAX_CAPTION_WORDS, MAX_EPOCHS, MAX_FIGURES,  # noqa: F401
                            MAX_IMAGES, MAX_READERS, MAX_REGIONS, MAX_SAMPLES, MAX_SEED,
                            MAX_STEPS, Bound, bounded)
from trainer import upgrade
from trainer.components import Component, component, file_form
from trainer.decoders import DECODERS, build_decoder
from trainer.decoding import DecodingConfig
from trainer.objectives import OBJECTIVES
from trainer.optimizers import OPTIMIZERS
from trainer.scoring.metrics import selectable

SPLITS = ("train", "val", "test")


@dataclass
class DataConfig:
    captions: str  # a folder written by `capstack prepare`
    features: list[str]  # stores or the pointer jsons naming them; several are concatenated
    seq_per_img: int = bounded(5, 1, MAX_SAMPLES)
    batching: Literal["images", "length_buckets", "one_length"] = "images"  # trainer/data.py
    max_regions: int = bounded(0, 0, MAX_REGIONS)  # 0: all
    box_geometry: bool = False  # append each region's [x1/w, y1/h, x2/w, y2/h, area] to its feature
    # processes that read the training batches ahead of the step (trainer/data.py); 0: the
    # training process itself. The same batches in the same order with any number.
    readers: int = bounded(0, 0, MAX_READERS)

    def check(self):
        if not self.features:
            yield "features: name at least one store"


@dataclass
class TrainConfig:
    epochs: int = bounded(10, 1, MAX_EPOCHS)
    batch_size: int = bounded(50, 1, MAX_BATCH)  # images; each brings seq_per_img captions
    lr: float = bounded(4e-4, above=0)
    optimizer: Component = component(OPTIMIZERS, default_factory=lambda: _adam())
    grad_clip: float = bounded(5.0, 0)  # max gradient norm; 0 disables
    lr_decay_every: int = bounded(0, 0, MAX_EPOCHS)  # epochs; 0 keeps lr constant
    lr_decay_rate: float = bounded(0.8, above=0, high=1)
    # trainer/training/selection.py: what best.pt keeps, and what epochs without a better one do
    select_on: str = "cider"  # the greedy validation score best.pt keeps: a metric's key
    lr_decay_patience: int = bounded(0, 0, MAX_EPOCHS)  # lr x lr_decay_rate each N such; 0: never
    early_stop_patience: int = bounded(0, 0, MAX_EPOCHS)  # stop after N such epochs; 0: never
    checkpoint_every: int = bounded(0, 0, MAX_STEPS)  # steps; 0: at the end of each epoch only
    log_every: int = bounded(10, 1, MAX_STEPS)  # steps between train lines in metrics.jsonl
    val_images: int = bounded(0, 0, MAX_IMAGES)  # 0: the whole validation split
    max_len: int = bounded(16, 1, MAX_CAPTION_WORDS)  # decoding length: validation, RL, eval
    seed: int = bounded(0, 0, MAX_SEED)
    init_from: str = ""  # a checkpoint whose weights start this run (RL after XE)
    # and its optimiser's state (Adam's moments: RL goes on where XE ended, as
    # self-critical.pytorch switches loss inside one run), at this run's lr
    init_optimizer: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # autocast: auto = bfloat16 on CUDA, none on a CPU; bfloat16 or float16 on either device
    # (float16 with a gradient scaler; on a CPU not with nn.LSTM: show_tell, lstm3); off.
    # true / false (the old form) read as auto / off.
    amp: Literal["auto", "bfloat16", "float16", "off"] = "auto"
    tensorboard: bool = False  # TensorBoard events in the run's events/ (capstack[tensorboard])
    # steps: the decoder's teacher-forced recurrence and per-word step through torch.compile
    # during training steps (trainer/training/compiled.py); off: as written
    compile: Literal["off", "steps"] = "off"
    # torch.compile's mode; auto: reduce-overhead (CUDA graphs) on CUDA, default elsewhere
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"] = "auto"

    def check(self):
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            yield f"device: unknown device {shown(self.device)} (auto, cpu, cuda, cuda:N, mps)"
        choices = selectable()
        if self.select_on not in choices:
            yield (f"select_on: expected one of {', '.join(choices)} (the values a metric of "
                   f"trainer/scoring/metrics/ scores each epoch), got {shown(self.select_on)}")


@dataclass
class EvalConfig(DecodingConfig):
    """How ``capstack evaluate`` decodes (the fields of
    :class:`~trainer.decoding.DecodingConfig`: beam size, length, search, sampling,
    length penalty, constraints, captions per image) and what it scores and draws."""

    split: Literal["train", "val", "test"] = "test"
    figures: int = bounded(4, 0, MAX_FIGURES)  # attention figures of the first N evaluated images
    max_refs: int = bounded(0, 0, MAX_SAMPLES)  # each image's first N references scored; 0: all


def _adam() -> Component:
    return Component("adam", OPTIMIZERS.get("adam").Config())


def _xe() -> Component:
    return Component("xe", OBJECTIVES.get("xe").Config())


@dataclass
class ExperimentConfig:
    name: str
    decoder: Component = component(DECODERS)  # a field without a default (mypy sees one):
    data: DataConfig  # type: ignore[misc]
    objective: Component = component(OBJECTIVES, default_factory=_xe)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def build_decoder(self, vocab_size: int, feature_dim: int):
        """Its decoder, freshly initialised, for ``vocab_size`` words and features of
        ``feature_dim``: the one way a run, an evaluation and a checkpoint's check build it."""
        return build_decoder(self.decoder.name, self.decoder.config, vocab_size, feature_dim)

    def to_dict(self) -> dict:
        """The experiment in its file form (what checkpoints and config.json record)."""
        return {"name": self.name, "decoder": self.decoder.to_dict(),
                "data": dataclasses.asdict(self.data), "objective": self.objective.to_dict(),
                "train": file_form(self.train), "eval": dataclasses.asdict(self.eval)}


# ------------------------------------------------------------------------- reading


def load_experiment(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read an experiment yaml, apply ``section.key=value`` overrides, check everything."""
    path = Path(path)
    data = upgrade.experiment_file(extended(path, read_yaml_mapping(path), []), str(path))
    for item in overrides:
        for each in upgrade.override(item):
            apply_override(data, each, str(path), ExperimentConfig)
    return experiment_from_dict(data, str(path))


def extended(path: Path, data: dict, chain: list[Path]) -> dict:
    """``extends: OTHER.yaml`` (relative to the file): OTHER's experiment with this file's
    keys laid over it, mapping by mapping. A component given another ``name`` is replaced
    whole (the other's settings would not fit), as ``--set decoder.name=`` does; lists and
    other values replace. A paper block's variant is such a file: what it changes, alone."""
    if "extends" not in data:
        return data
    base = data["extends"]
    if not isinstance(base, str) or not base:
        raise CapstackError(f"{path}: extends: expected the path of another experiment file, "
                            f"got {shown(base)}")
    base_path = (path.parent / base).resolve()
    if base_path in chain or base_path == path.resolve():
        raise CapstackError(f"{path}: extends: {base} extends this file again (a cycle)")
    if not base_path.is_file():
        raise CapstackError(f"{path}: extends: {base_path} not found")
    own = {k: v for k, v in data.items() if k != "extends"}
    return laid_over(extended(base_path, read_yaml_mapping(base_path),
                              chain + [path.resolve()]), own)


def laid_over(base: dict, own: dict) -> dict:
    merged = dict(base)
    for key, value in own.items():
        below = base.get(key)
        renamed = isinstance(value, dict) and "name" in value and isinstance(below, dict) \
            and below.get("name") != value["name"]
        if isinstance(value, dict) and isinstance(below, dict) and not renamed:
            merged[key] = laid_over(below, value)
        else:
            merged[key] = value
    return merged


def read_yaml_mapping(path: Path) -> dict:
    """An experiment file's mapping, or why it cannot be read."""
    try:
        data = yaml.safe_load(read_text(path, "an experiment file"))
    except FileNotFoundError:
        raise CapstackError(f"{path}: experiment file not found") from None
    except UnicodeDecodeError as error:
        raise not_utf8(path, error) from None
    except OSError as error:
        raise CapstackError(f"{path}: cannot read ({error.strerror or error})") from None
    except yaml.YAMLError as error:
        raise CapstackError(f"{path}: not valid yaml ({error})") from None
    except ValueError as error:  # an integer of more digits than Python reads
        raise CapstackError(f"{path}: not valid yaml ({error})") from None
    except RecursionError:
        raise too_deep(path) from None
    if not isinstance(data, dict):
        raise CapstackError(f"{path}: expected a mapping at the top level")
    return check_expanded(data, str(path), "an experiment file")


def experiment_from_dict(data: dict, where: str) -> ExperimentConfig:
    """A checked experiment from today's file form (a checkpoint's ``experiment`` once
    trainer/upgrade.py has read it)."""
    config = from_dict(ExperimentConfig, data, where)
    check_pairing(config, where)
    return config


def apply_override(data: dict, item: str, where: str, schema: type | None = None) -> None:
    """``train.epochs=3`` -> data["train"]["epochs"] = yaml value "3" (typed later, strictly).

    ``A.B.name=OTHER`` where ``A.B`` is a component of ``schema`` (the experiment's
    ``objective``, SCST's ``objective.reward``) replaces that mapping by ``{name: OTHER}``
    when OTHER is not the name it had."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise CapstackError(f"--set {item!r}: expected SECTION.KEY=VALUE")
    *parents, last = key.split(".")
    try:
        parsed = yaml.safe_load(value) if value else ""
    except RecursionError:
        raise too_deep(f"--set {key}") from None
    except (yaml.YAMLError, ValueError) as error:  # ValueError: an int past Python's digits
        raise CapstackError(f"--set {item!r}: the value is not valid YAML "
                            f"({getattr(error, 'problem', None) or error})") from None
    check_expanded(parsed, f"--set {key}", "an experiment's value")
    if last == "name" and schema is not None and is_component(schema, data, parents):
        holder = data
        for part in parents[:-1]:
            holder = holder[part]
        section = holder.get(parents[-1])
        if not isinstance(section, dict) or section.get("name") != parsed:
            holder[parents[-1]] = {"name": parsed}
            return
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise CapstackError(f"{where}: --set {key}: {part} is not a section")
    node[last] = over(node.get(last), parsed)


def over(below: Any, given: Any) -> Any:
    """What ``--set KEY=GIVEN`` leaves at KEY: a mapping laid over the mapping there, as
    ``extends`` lays a file over another (``--set 'train={epochs: 3}'`` keeps the file's other
    train keys; it dropped them), unless it names another component, which starts afresh."""
    if not (isinstance(given, dict) and isinstance(below, dict)):
        return given
    if "name" in given and given["name"] != below.get("name"):
        return given
    return laid_over(below, given)


def is_component(schema: type, data: dict, path: list[str]) -> bool:
    """Whether ``path`` (["objective", "reward"]) names a component field of dataclass
    ``schema``, following the component names ``data`` holds on the way (which objective's
    config has a ``reward``)."""
    cls: Any = schema  # walked down: a config dataclass, then the one a component names
    node: Any = data  # walked down: a mapping, or what a missing part gives
    for k, part in enumerate(path):
        f = next((f for f in dataclasses.fields(cls) if f.name == part), None) \
            if dataclasses.is_dataclass(cls) else None
        if f is None or not isinstance(node, dict):
            return False
        node = node.get(part)
        if "registry" in f.metadata:
            if k == len(path) - 1:
                return True
            registry = f.metadata["registry"]
            default = f.default_factory().name if f.default_factory is not dataclasses.MISSING \
                else None
            name = node.get("name", default) if isinstance(node, dict) else None
            if not isinstance(name, str) or name not in registry:
                return False
            cls = registry.get(name).Config
        else:
            cls = typing.get_type_hints(cls)[part]
    return False


def from_dict(cls, data, where: str, prefix: str = ""):
    """Fill dataclass ``cls`` from ``data``; errors read ``FILE: a.b: problem``."""
    if not isinstance(data, dict):
        raise CapstackError(f"{where}: {prefix or 'top level'}: expected a mapping, got "
                            f"{shown(data)}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise CapstackError(f"{where}: {prefix}{unknown[0]}: unknown key {shown(unknown[0])} "
                            f"(known: {', '.join(sorted(f.name for f in fields))})")
    values = {}
    for f in fields:
        if f.name in data:
            values[f.name] = _field_value(f, hints[f.name], data[f.name], where, prefix + f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise CapstackError(f"{where}: {prefix}{f.name}: missing key {f.name!r}")
    obj = cls(**values)
    for problem in getattr(obj, "check", lambda: ())():
        raise CapstackError(f"{where}: {prefix}{problem}")
    return obj


def _field_value(f, hint, value, where: str, name: str):
    if "registry" in f.metadata:
        registry, beside = f.metadata["registry"], f.metadata.get("beside")
        if typing.get_origin(hint) is list:
            if not isinstance(value, list):
                raise CapstackError(f"{where}: {name}: expected a list of {registry.kind} "
                                    f"mappings, each with its name, got {shown(value)}")
            return [component_from_dict(registry, v, where, f"{name}[{k}]", beside=beside)
                    for k, v in enumerate(value)]
        default = f.default_factory().name if f.default_factory is not dataclasses.MISSING else None
        return component_from_dict(registry, value, where, name, default, beside)
    value = convert(hint, value, where, name)
    if "bound" in f.metadata:
        numbers = enumerate(value) if isinstance(value, list) else [(None, value)]
        for k, number in numbers:
            problem = f.metadata["bound"].problem(number)
            if problem:
                raise CapstackError(f"{where}: {name}{'' if k is None else f'[{k}]'}: {problem}")
    return value


def component_from_dict(registry, value, where: str, name: str,
                        default: str | None = None, beside: type | None = None) -> Component:
    """``{name: top_down, hidden: 512}`` -> Component("top_down", TopDownConfig(hidden=512)).

    A mapping without ``name`` is the ``default`` component's, when there is one. The keys
    of ``beside`` (a mix part's ``weight``) fill that dataclass, the others the component's
    config; a field of that config declared with ``component(...)`` is read in turn."""
    if isinstance(value, dict) and "name" not in value and default is not None:
        value = {"name": default, **value}
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise CapstackError(f"{where}: {name}: expected a mapping with the {registry.kind}'s "
                            f"name (choose {', '.join(registry)}), got {shown(value)}")
    if value["name"] not in registry:
        raise CapstackError(f"{where}: {name}.name: unknown {registry.kind} {value['name']!r} "
                            f"(choose {', '.join(registry)})")
    cls = registry.get(value["name"])
    own = {f.name for f in dataclasses.fields(beside)} if beside is not None else set()
    settings = {k: v for k, v in value.items() if k != "name" and k not in own}
    known = own | {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(settings) - known)
    if unknown and own:  # said here, so that the holder's keys are among those listed
        raise CapstackError(f"{where}: {name}.{unknown[0]}: unknown key {shown(unknown[0])} "
                            f"(known: {', '.join(sorted(known))})")
    extra = from_dict(beside, {k: v for k, v in value.items() if k in own}, where, name + ".") \
        if beside is not None else None
    return Component(value["name"], from_dict(cls.Config, settings, where, name + "."), extra)


def convert(hint, value, where: str, field: str):
    """``value`` as type ``hint`` (int, float, bool, str, Literal, list[...], dict, dataclass,
    X | None)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        hint = next(o for o in options if o is not type(None))
        origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return value
        raise CapstackError(f"{where}: {field}: expected one of {', '.join(map(str, choices))}, "
                            f"got {shown(value)}")
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where, field + ".")
    if origin is list:
        if not isinstance(value, list):
            raise CapstackError(f"{where}: {field}: expected a list, got {shown(value)}")
        (item,) = typing.get_args(hint)
        return [convert(item, v, where, f"{field}[{k}]") for k, v in enumerate(value)]
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise CapstackError(f"{where}: {field}: expected a mapping, got {shown(value)}")
        return dict(value)
    return _scalar(hint, value, where, field)


def _scalar(hint, value, where: str, field: str):
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int past any float: past any bound too
                return math.inf if value > 0 else -math.inf
        if isinstance(value, str):  # yaml reads 4e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"{where}: {field}: unsupported config type {hint!r}")
    raise CapstackError(f"{where}: {field}: expected {hint.__name__}, got {shown(value)}")


def check_pairing(config: ExperimentConfig, where: str) -> None:
    """The objective can train the decoder (C2F needs a staged decoder), said before any work."""
    objective = OBJECTIVES.get(config.objective.name)
    needed = objective.decoder_type
    if not issubclass(DECODERS.get(config.decoder.name), needed):
        able = [name for name, cls in DECODERS.items() if issubclass(cls, needed)]
        raise CapstackError(f"{where}: objective.name: {config.objective.name} needs "
                            f"{needed.requirement} ({', '.join(able)}); decoder.name is "
                            f"{config.decoder.name}")
