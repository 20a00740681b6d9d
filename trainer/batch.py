"""What a training step gets: this rank's part of a global batch, with the global batch's counts.

A :class:`TrainBatch` holds this process's images of a global batch; its
:class:`Share` carries the counts that make a loss this rank's part of the
global mean.

Under DDP every rank computes a loss on its own images and DDP averages the
gradients over the ranks. Were each rank's loss a mean over its own tokens, a
token's weight would depend on how many tokens its rank happened to get. So
losses divide *sums* by the counts of the whole global batch (a :class:`Share`
carries them): the ranks' losses then add up to the one-process loss, and the
gradient DDP computes (``world`` x each rank's, averaged) is the one-process
gradient. In one process every divisor is the batch's own count, which gives the
usual means.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from torch import Tensor


def _local(count: Tensor) -> Tensor:
    return count


@dataclass
class Share:
    tokens: int  # target tokens (words and <eos>) of the global batch's captions
    captions: int  # captions of the global batch
    images: int  # images of the global batch
    first: int = 0  # index in the global batch of this rank's first image
    weight: float = 1.0  # 0 when this rank only pads a batch that has fewer images than ranks
    total: Callable[[Tensor], Tensor] = field(default=_local, repr=False)  # sum over ranks

    def global_count(self, local: Tensor) -> Tensor:
        """A count known only after this step's work (sampled tokens), summed over ranks."""
        return self.total((local * self.weight).float()).clamp(min=1)


def whole_batch(tokens: int, captions: int, images: int) -> Share:
    """One process: the batch is its own global batch."""
    return Share(tokens, captions, images)


@dataclass
class TrainBatch:
    """This process's images of one global batch (all of them in a single process)."""

    image_ids: list[int]
    feats: torch.Tensor  # [B, L, D]
    mask: torch.Tensor  # [B, L] bool
    captions: torch.Tensor  # [B*S, T+2] long
    share: Share  # the global batch's counts that losses divide by
    index: int = 0  # the batch's position in its epoch
    seq_per_img: int = 1  # captions of each image (consecutive rows of ``captions``)
    width: int = -1  # the longest caption's columns (<bos> included): set where it is made

    def __post_init__(self):
        """The caption width taken where the captions are made, on the host: read from a
        batch already on a GPU it would stop the host until the GPU caught up."""
        if self.width < 0:
            self.width = int((self.captions != 0).sum(1).max()) if len(self.captions) else 0

    def pin_memory(self) -> "TrainBatch":
        """The tensors in page-locked memory, so that :meth:`to` a GPU copies asynchronously."""
        return replace(self, feats=self.feats.pin_memory(), mask=self.mask.pin_memory(),
                       captions=self.captions.pin_memory())

    def to(self, device: torch.device) -> "TrainBatch":
        return replace(self, feats=self.feats.to(device, torch.float32, non_blocking=True),
                       mask=self.mask.to(device, non_blocking=True),
                       captions=self.captions.to(device, non_blocking=True))


@dataclass
class EvalBatch:
    image_ids: list[int]
    feats: torch.Tensor
    mask: torch.Tensor
    boxes: torch.Tensor | None

    def to(self, device: torch.device) -> "EvalBatch":
        return EvalBatch(self.image_ids, self.feats.to(device, torch.float32),
                         self.mask.to(device), self.boxes)
