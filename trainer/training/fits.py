"""Whether a decoder fits the device that trains it, said before anything is allocated.

Every size of a decoder has a bound (trainer/bounds.py), but a bound every machine could hold
would refuse real decoders on the machines that can: ``decoder.hidden: 65536`` lies inside
its bound, and makes a show_tell of 17 billion parameters, whose first weight alone asked for
68.7 GB. So the decoder is first built on torch's meta device (shapes, no memory) and its
parameters counted; one whose float32 weights and their gradients alone, the least a training
step holds, exceed the device's memory is refused, naming the settings that made it so.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from pipeline.core.errors import CapstackError
from trainer.config import ExperimentConfig

BYTES_PER_PARAMETER = 8  # a float32 weight and its gradient (Adam's moments come on top)


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory the device has (a CPU: the machine's), None where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def parameter_count(config: ExperimentConfig, vocab_size: int, feature_dim: int) -> int:
    """The decoder's parameters, built on the meta device: no memory, a few milliseconds."""
    with torch.device("meta"):
        model = config.build_decoder(vocab_size, feature_dim)
    return sum(p.numel() for p in model.parameters())


def raised_settings(config: ExperimentConfig) -> list[str]:
    """``decoder.hidden 65536`` for each whole-number size of the decoder set above its
    default: what made it large."""
    settings = config.decoder.config
    return [f"decoder.{f.name} {getattr(settings, f.name)}"
            for f in dataclasses.fields(settings)
            if isinstance(f.default, int) and not isinstance(f.default, bool)
            and isinstance(getattr(settings, f.name), int)
            and getattr(settings, f.name) > f.default]


def check_fits(config: ExperimentConfig, vocab_size: int, feature_dim: int,
               device: torch.device) -> None:
    """Refuse a decoder whose weights and gradients alone outgrow ``device``'s memory."""
    memory = device_memory(device)
    if memory is None:
        return
    count = parameter_count(config, vocab_size, feature_dim)
    need = count * BYTES_PER_PARAMETER
    if need <= memory:
        return
    raised = raised_settings(config)
    if len(raised) == 1:
        made = f"{raised[0].replace(' ', ': ', 1)} makes"
    else:
        made = f"decoder: {', '.join(raised)} make" if raised else \
            f"decoder: a vocabulary of {vocab_size} words and features of {feature_dim} make"
    where = "this machine" if device.type == "cpu" else str(device)
    smaller = " or ".join(r.split()[0] for r in raised) if raised else "the decoder's sizes"
    raise CapstackError(
        f"{made} the {config.decoder.name} decoder {count / 1e9:.1f} billion parameters, whose "
        f"float32 weights and gradients alone need {need / 1e9:.1f} GB, more than the "
        f"{memory / 1e9:.1f} GB of memory of {where}; choose a smaller {smaller}")
