"""Three stacked LSTM layers, no intermediate supervision (Stack-Cap's "LSTM3 layers").

Show and Tell with two more LSTM layers on top of the first: the baseline that
shows depth alone does not help without the coarse-to-fine supervision.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.decoders import DECODERS
from trainer.decoders.show_tell import ShowTell, ShowTellConfig


@dataclass
class LSTM3Config(ShowTellConfig):
    layers: int = 3


@DECODERS.register("lstm3")
class LSTM3(ShowTell):
    """Three stacked LSTM layers fed the image first, no intermediate supervision (LSTM3 layers)."""

    Config = LSTM3Config
