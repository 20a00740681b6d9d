"""What every objective is: a registered component that says what one training step minimises.

An objective is chosen by name from the experiment file (``objective: {name:
scst, samples: 5}``), with its own config dataclass. It declares what it needs
of a decoder (``decoder_type``: C2F needs a :class:`StagedDecoder`) and of DDP
(:meth:`Objective.leaves_parameters_out`), which the experiment and the loop read; the
loop never branches on its name.

Per step the loop calls, in order::

    loss, stats = TrainingLoss(decoder, objective)(batch, key)   # what DDP wraps
    ... backward and the decoder's optimiser step ...
    stats |= objective.after_step(decoder, batch, key)         # state updates, own optimisers

Losses divide sums by the global batch's counts (``batch.share``,
trainer/batch.py), so the losses of all ranks add up to the
one-process loss. Statistics follow the same rule and are summed over ranks,
except the ``time_*`` ones, which are this rank's own seconds.

An objective may own modules (a discriminator), optimisers and state of its
own: :meth:`Objective.modules`, :meth:`Objective.optimizers` and
:meth:`Objective.extra_state` are saved in every checkpoint and restored by an
exact resume (:meth:`Objective.state_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Generic, TypeVar

import torch
from torch import Tensor, nn

from trainer.decoding import SamplingNoise
from trainer.decoders.base import Decoder

if TYPE_CHECKING:
    from pipeline.captions.prepared import Captions
    from trainer.batch import Share, TrainBatch
    from trainer.data import TrainBatches

DecoderT = TypeVar("DecoderT", bound=Decoder)  # the decoders an objective trains (decoder_type)


@dataclass(frozen=True)
class StepKey:
    """Which step this is: what a step's random draws are a function of (exact resume, DDP)."""

    seed: int
    epoch: int
    batch: int

    def sampling_noise(self, share: "Share", per_image: int, *key: int) -> SamplingNoise:
        """The uniforms of ``per_image`` samples of every image of the global batch, this rank's
        rows: the same draws for an image whichever rank samples it."""
        return SamplingNoise((self.seed, self.epoch, self.batch, *key), share.images * per_image,
                             share.first * per_image)


def _no_log(entry: dict) -> None:
    """Where an objective's log entries go when the run keeps no log."""


def _no_batches(split: str) -> "TrainBatches":
    raise RuntimeError(f"this objective draws images of the {split} split of its own, and the "
                       f"run that built it gave it none (Setting.batches)")


@dataclass
class Setting:
    """What a run gives its objective to build on."""

    captions: "Captions"  # the prepared captions trained on (vocabulary, train split)
    max_len: int  # decoding length of samples and greedy decodes
    device: torch.device = torch.device("cpu")
    epoch_batches: int = 0  # global batches in an epoch of the train split
    # a split's images in batches of the run's size (images, not one_length), this rank's part,
    # for an objective that draws images of its own (HACap's discriminator rounds)
    batches: Callable[[str], "TrainBatches"] = _no_batches
    # an entry for the run's metrics log (``kind`` given; the run adds epoch, step and time)
    log: Callable[[dict], None] = _no_log


class Objective(Generic[DecoderT]):
    """Subclasses set ``Config``, ``label``, ``family`` and implement :meth:`loss`."""

    Config: ClassVar[type]
    label: ClassVar[str]  # the Training column of the tables: XE, SCST, C2F
    family: ClassVar[str]  # the tables' block: cross-entropy, reinforcement, ...
    decoder_type: ClassVar[type] = Decoder  # what it needs of a decoder

    def __init__(self, config, setting: Setting):
        self.config, self.setting = config, setting

    def bind(self, decoder: DecoderT) -> None:
        """Called once with the decoder it will train, before any resume: an objective that
        trains a part of the decoder with its own optimiser (HACap's discriminator) makes it
        here, so that a checkpoint's optimiser state can be restored into it."""

    def leaves_parameters_out(self, decoder: DecoderT) -> bool:
        """Whether this loss, as configured, leaves some of the parameters that ``decoder``'s
        optimiser trains without a gradient. DDP must then look for them after every
        forward (``find_unused_parameters``, a walk of the graph), which it otherwise skips."""
        return False

    def loss(self, decoder: DecoderT, batch: "TrainBatch", key: StepKey) -> tuple[Tensor, dict]:
        """This rank's part of the global batch's loss, and its statistics."""
        raise NotImplementedError

    def after_step(self, decoder: DecoderT, batch: "TrainBatch", key: StepKey) -> dict:
        """After the decoder's optimiser step: explicit state updates, the objective's own
        optimisers' steps; more statistics."""
        return {}

    # -- what the objective owns besides the decoder: checkpointed, restored on resume

    def modules(self) -> dict[str, nn.Module]:
        return {}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {}

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return {"modules": {k: m.state_dict() for k, m in self.modules().items()},
                "optimizers": {k: o.state_dict() for k, o in self.optimizers().items()},
                "extra": self.extra_state()}

    def load_state_dict(self, state: dict) -> None:
        for name, module in self.modules().items():
            module.load_state_dict(state["modules"][name])
        for name, optimizer in self.optimizers().items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.load_extra_state(state.get("extra", {}))

    def close(self) -> None:
        """Let go of what it holds beyond memory (a reward's scorer process) when training
        ends; nothing by default."""

    def to(self, device: torch.device) -> "Objective":
        for module in self.modules().values():
            module.to(device)
        return self


class TrainingLoss(nn.Module):
    """The module DistributedDataParallel wraps: its parameters are the decoder's, its forward
    the objective's whole loss (RL samples step by step through ``decoder.step``, which DDP
    must see inside one forward)."""

    def __init__(self, decoder: Decoder, objective: Objective):
        super().__init__()
        self.decoder = decoder
        self.objective = objective  # not a module: its own modules are not the decoder's

    def forward(self, batch: "TrainBatch", key: StepKey) -> tuple[Tensor, dict]:
        loss, stats = self.objective.loss(self.decoder, batch, key)
        return loss * batch.share.weight, stats
