"""A run's arithmetic precision: the autocast its steps run under, and float16's gradient scaler.

``train.amp``:

- ``auto``: bfloat16 autocast on CUDA, none on a CPU (the demo's numbers are float32's);
- ``bfloat16``: bfloat16 autocast on either device. It keeps float32's exponent range, so
  gradients need no scaling. On a CPU with AMX (Sapphire Rapids and later) its matrix products
  run about 3x faster than float32's; on one without, more slowly;
- ``float16``: float16 autocast with a gradient scaler (``torch.amp.GradScaler``): the loss is
  scaled before backward so small gradients do not flush to zero, and unscaled before clipping.
  On a CPU, not for a decoder built on nn.LSTM (show_tell, lstm3), which has no float16 kernel
  there: refused before the first step;
- ``off``: float32 throughout.

Autocast runs the matrix products in the low precision and keeps reductions (softmax,
log-softmax, losses) and the weights in float32 (torch's autocast op lists).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from pipeline.core.errors import CapstackError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The dtype ``amp`` autocasts to on ``device``, None for none."""
    if amp == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return DTYPES.get(amp)


class Precision:
    """The autocast context and the backward / optimiser step that go with it."""

    def __init__(self, amp: str, device: torch.device):
        self.device, self.dtype = device, autocast_dtype(amp, device)
        self.scaler = torch.amp.GradScaler(device.type) if self.dtype is torch.float16 else None

    @property
    def label(self) -> str:
        return "float32" if self.dtype is None else str(self.dtype).removeprefix("torch.")

    def refuse_own_optimisers(self, optimisers: dict) -> None:
        """float16 scales the decoder's loss only: an objective that steps its own optimisers
        (HACap's discriminator) would get unscaled float16 gradients, silently flushed to 0."""
        if self.scaler is not None and optimisers:
            raise CapstackError(
                f"train.amp: float16 scales the decoder's gradients only; this objective also "
                f"trains {', '.join(sorted(optimisers))} with its own optimiser: use bfloat16")

    def refuse_unsupported(self, decoder: str, modules) -> None:
        """float16 on a CPU: torch's nn.LSTM has no float16 kernel there (oneDNN raises
        ``could not create a primitive descriptor for the LSTM``, at the first step)."""
        if self.dtype is not torch.float16 or self.device.type != "cpu":
            return
        if any(isinstance(m, torch.nn.LSTM) for module in modules for m in module.modules()):
            raise CapstackError(
                f"train.amp: float16 on a CPU cannot run the {decoder} decoder: torch's "
                f"nn.LSTM has no float16 kernel on a CPU; use bfloat16 or off there, or "
                f"float16 on CUDA")

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer, clip: float) -> None:
        """Clip the gradients' global norm at ``clip`` (0: no clipping), then step; with a
        scaler, gradients are unscaled first, and a step with inf/NaN gradients is skipped
        (the scaler then lowers its scale)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(
                [p for group in optimizer.param_groups for p in group["params"]], clip)
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict:
        return {} if self.scaler is None else {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
