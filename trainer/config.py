"""Experiment configuration: yaml -> dataclasses, strictly (an unknown key or a wrong type is an error).

An experiment file names a decoder and its parameters, the features and
captions it reads, and how to train and evaluate it::

    name: soft_attention
    decoder: soft_attention
    decoder_config: {hidden: 512, att_hidden: 512}
    data: {captions: data/prepared, features: [data/features/grid.json]}
    train: {epochs: 10, batch_size: 50, lr: 4.0e-4}
    eval: {beam_size: 5}

``--set train.epochs=3`` overrides one value, type-checked like the file.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.core.errors import CapstackError


@dataclass
class DataConfig:
    captions: str  # a folder written by `capstack prepare`
    features: list[str]  # stores or the pointer jsons naming them; several are concatenated
    seq_per_img: int = 5
    bucket_by_length: bool = False  # Show-Attend-Tell: batches of similar caption length
    max_regions: int = 0  # 0: all
    box_geometry: bool = False  # append each region's [x1/w, y1/h, x2/w, y2/h, area] to its feature


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 50  # images; each brings seq_per_img captions
    lr: float = 4e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    grad_clip: float = 5.0  # max gradient norm; 0 disables
    lr_decay_every: int = 0  # epochs; 0 keeps lr constant
    lr_decay_rate: float = 0.8
    scheduled_sampling_start: int = -1  # epoch; -1 disables
    scheduled_sampling_increase_every: int = 5
    scheduled_sampling_increase: float = 0.05
    scheduled_sampling_max: float = 0.25
    checkpoint_every: int = 0  # steps; 0: at the end of each epoch only
    log_every: int = 10  # steps between train lines in metrics.jsonl
    val_images: int = 0  # 0: the whole validation split
    max_len: int = 16  # decoding length in validation and evaluation
    seed: int = 0
    objective: str = "xe"  # xe | scst | c2f (Stack-Cap's coarse-to-fine reward)
    init_from: str = ""  # a checkpoint whose weights start this run (RL after XE)
    cider_cache: str = ""  # scst: the `capstack cider-cache` file of the train split
    scst_samples: int = 5  # sampled captions per image
    scst_baseline: str = "greedy"  # greedy | mean (of the image's other samples)
    c2f_coarse_term: bool = False  # c2f: add a self-critical term for the coarse stage
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: bool = True  # bfloat16 autocast on CUDA; ignored on CPU


@dataclass
class EvalConfig:
    beam_size: int = 5
    max_len: int = 16
    split: str = "test"
    figures: int = 4  # attention figures of the first N evaluated images


@dataclass
class ExperimentConfig:
    name: str
    decoder: str
    data: DataConfig
    decoder_config: dict = field(default_factory=dict)  # checked against the decoder's own dataclass
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_experiment(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    """Read an experiment yaml and apply ``section.key=value`` overrides."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise CapstackError(f"{path}: experiment file not found") from None
    except yaml.YAMLError as error:
        raise CapstackError(f"{path}: not valid yaml ({error})") from None
    if not isinstance(data, dict):
        raise CapstackError(f"{path}: expected a mapping at the top level")
    for item in overrides:
        apply_override(data, item, str(path))
    config = from_dict(ExperimentConfig, data, str(path))
    check_experiment(config, str(path))
    return config


def apply_override(data: dict, item: str, where: str) -> None:
    """``train.epochs=3`` -> data["train"]["epochs"] = yaml value "3" (typed later, strictly)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise CapstackError(f"--set {item!r}: expected SECTION.KEY=VALUE")
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise CapstackError(f"{where}: --set {key}: {part} is not a section")
    node[last] = yaml.safe_load(value) if value else ""


def from_dict(cls, data, where: str, prefix: str = ""):
    """Fill dataclass ``cls`` from ``data``; errors read ``FILE: a.b: problem``."""
    if not isinstance(data, dict):
        raise CapstackError(f"{where}: {prefix or 'top level'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise CapstackError(f"{where}: {prefix}{unknown[0]}: unknown key {unknown[0]!r} "
                            f"(known: {', '.join(sorted(names))})")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = convert(hints[f.name], data[f.name], where, prefix + f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise CapstackError(f"{where}: {prefix}{f.name}: missing key {f.name!r}")
    return cls(**values)


def convert(hint, value, where: str, field: str):
    """``value`` as type ``hint`` (int, float, bool, str, list[...], dict, dataclass, X | None)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        hint = next(o for o in options if o is not type(None))
        origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where, field + ".")
    if origin is list:
        if not isinstance(value, list):
            raise CapstackError(f"{where}: {field}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [convert(item, v, where, f"{field}[{k}]") for k, v in enumerate(value)]
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise CapstackError(f"{where}: {field}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
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
    raise CapstackError(f"{where}: {field}: expected {hint.__name__}, got {value!r}")


def check_experiment(config: ExperimentConfig, where: str) -> None:
    checks = [
        (config.data.seq_per_img >= 1, "data.seq_per_img: must be at least 1"),
        (len(config.data.features) >= 1, "data.features: name at least one store"),
        (config.train.epochs >= 1, "train.epochs: must be at least 1"),
        (config.train.batch_size >= 1, "train.batch_size: must be at least 1"),
        (config.train.lr > 0, "train.lr: must be positive"),
        (config.train.log_every >= 1, "train.log_every: must be at least 1"),
        (len(config.train.betas) == 2, "train.betas: expected two numbers"),
        (config.eval.beam_size >= 1, "eval.beam_size: must be at least 1"),
        (config.train.objective in ("xe", "scst", "c2f"),
         "train.objective: expected xe, scst or c2f"),
        (config.train.objective == "xe" or bool(config.train.cider_cache),
         "train.cider_cache: RL needs the CIDEr-D cache (capstack cider-cache)"),
        (config.eval.split in ("train", "val", "test"), "eval.split: expected train, val or test"),
    ]
    for ok, problem in checks:
        if not ok:
            raise CapstackError(f"{where}: {problem}")
