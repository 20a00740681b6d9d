"""An LSTM cell whose input is a concatenation of named parts, with one weight block per part.

    gates = W_s [x_t, h_{t-1}] + sum_p W_p x_p + b,   (i, f, g, o) = split(gates)
    c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g),     h_t = sigmoid(o) tanh(c_t)

These are ``nn.LSTMCell``'s gates (PyTorch's order i, f, g, o) on the concatenated
input, with its two biases as one. What differs is where the products happen: a
part that is the same at every step (an image's mean feature) or known before the
recurrence (the teacher-forced words) is projected by :meth:`project`, once for
every step, and the step multiplies only what the previous step made: its step
inputs and h_{t-1}, with one matrix product. Each block being its own parameter
matters: a slice of one weight taken at every step costs, in backward, a
zero-filled gradient of the whole weight per step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PartsLSTMCell(nn.Module):
    """``parts``: name -> size, in the order of the concatenated input; ``step_parts``: the
    names the step multiplies (the rest are projected ahead)."""

    def __init__(self, parts: dict[str, int], step_parts: list[str], hidden: int):
        super().__init__()
        unknown = set(step_parts) - set(parts)
        if unknown:
            raise ValueError(f"step parts {sorted(unknown)} are not among the parts {list(parts)}")
        self.parts, self.step_parts, self.hidden_size = dict(parts), list(step_parts), hidden
        self.input_size = sum(parts.values())
        step_input = sum(parts[name] for name in step_parts)
        self.step_weight = nn.Parameter(torch.empty(4 * hidden, step_input + hidden))
        self.ahead = nn.ParameterDict({name: nn.Parameter(torch.empty(4 * hidden, size))
                                       for name, size in parts.items() if name not in step_parts})
        self.bias = nn.Parameter(torch.empty(4 * hidden))
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(self._from_lstm_cell)

    def reset_parameters(self) -> None:
        """nn.LSTMCell's initialisation, drawn as it draws (weight_ih, weight_hh, bias_ih, bias_hh,
        each U(-1/sqrt(h), 1/sqrt(h))) and split into the blocks: a decoder that swaps its
        nn.LSTMCell for this cell starts from the very weights the same seed gave it."""
        cell = nn.LSTMCell(self.input_size, self.hidden_size, device=self.bias.device,
                           dtype=self.bias.dtype)
        with torch.no_grad():
            for name, block in self._blocks(dict(cell.named_parameters())).items():
                self.get_parameter(name).copy_(block)

    def project(self, name: str, x: Tensor, with_bias: bool = False) -> Tensor:
        """Part ``name``'s share of the gates, [..., size] -> [..., 4h] (plus the bias)."""
        return F.linear(x, self.ahead[name], self.bias if with_bias else None)

    def forward(self, step_inputs: list[Tensor], ahead: Tensor,
                state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """step_inputs (in ``step_parts`` order) [N, size], ahead: the projected parts and the
        bias summed [N, 4h] -> (h_t, c_t)."""
        h, c = state
        gates = torch.addmm(ahead, torch.cat([*step_inputs, h], 1), self.step_weight.t())
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def _blocks(self, lstm: dict[str, Tensor]) -> dict[str, Tensor]:
        """An nn.LSTMCell's weight_ih, weight_hh, bias_ih, bias_hh -> this cell's parameters."""
        blocks = dict(zip(self.parts, lstm["weight_ih"].split(list(self.parts.values()), 1)))
        return {"step_weight": torch.cat([blocks[name] for name in self.step_parts]
                                         + [lstm["weight_hh"]], 1),
                **{"ahead." + name: blocks[name] for name in self.ahead},
                "bias": lstm["bias_ih"] + lstm["bias_hh"]}

    def _from_lstm_cell(self, state_dict, prefix, *args) -> None:
        """Weights saved from an ``nn.LSTMCell`` on the concatenated parts, split into blocks."""
        if prefix + "weight_ih" not in state_dict:
            return
        lstm = {name: state_dict.pop(prefix + name)
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
        state_dict.update({prefix + name: block for name, block in self._blocks(lstm).items()})
