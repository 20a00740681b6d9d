"""Stack-Cap* (Gu et al. 2018): Stack-Cap's coarse-to-fine decoders, each fine stage with an
independent attention on the preceding stage's hidden state (no stacking of eq 8)."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.decoders import DECODERS
from trainer.decoders.stack_cap import StackCap, StackCapConfig


@dataclass
class StackCapStarConfig(StackCapConfig):
    stacked: bool = False


@DECODERS.register("stack_cap_star")
class StackCapStar(StackCap):
    """Stack-Cap*: coarse-to-fine LSTMs with an independent attention per fine stage."""

    Config = StackCapStarConfig
