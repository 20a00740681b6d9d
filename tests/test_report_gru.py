"""The GRU baseline report's cell: its equations by hand, and where it parts from nn.GRUCell."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.decoders import build_decoder
from trainer.decoders.gru_init import GRUInitConfig
from trainer.modules.report_gru import ReportGRUCell


def sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v))


def test_one_step_equals_the_reports_equations_by_hand():
    """hidden 1, input 1; weights over [c, x]: W_r = [1, 0], W_u = [0, 1], W_c = [2, -1],
    biases 0.1, -0.2, 0.3; c = 0.5, x = 1."""
    cell = ReportGRUCell(1, 1)
    with torch.no_grad():
        cell.gates.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        cell.gates.bias.copy_(torch.tensor([0.1, -0.2]))
        cell.candidate.weight.copy_(torch.tensor([[2.0, -1.0]]))
        cell.candidate.bias.copy_(torch.tensor([0.3]))
    c, x = 0.5, 1.0
    relevance = sigmoid(1 * c + 0 * x + 0.1)
    update = sigmoid(0 * c + 1 * x - 0.2)
    candidate = math.tanh(2 * (relevance * c) - 1 * x + 0.3)
    expected = update * candidate + (1 - update) * c
    got = cell(torch.tensor([[x]]), torch.tensor([[c]])).item()
    assert got == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.1176, abs=1e-4)  # the numbers above, worked out


def test_the_gate_before_the_product_is_not_nn_grucells_gate_after_it():
    """With hidden 2, W_c [Γ_r ⊙ c] (the report) and Γ_r ⊙ (W_c c) (nn.GRUCell's place for
    the gate) differ: the cell computes the first."""
    torch.manual_seed(0)
    cell = ReportGRUCell(3, 2)
    x, c = torch.randn(4, 3), torch.randn(4, 2)
    r, u = torch.sigmoid(cell.gates(torch.cat([c, x], -1))).chunk(2, -1)
    w_c, w_x = cell.candidate.weight[:, :2], cell.candidate.weight[:, 2:]
    before = torch.tanh((r * c) @ w_c.T + x @ w_x.T + cell.candidate.bias)
    after = torch.tanh(r * (c @ w_c.T) + x @ w_x.T + cell.candidate.bias)
    got = cell(x, c)
    torch.testing.assert_close(got, u * before + (1 - u) * c)
    assert (got - (u * after + (1 - u) * c)).abs().max() > 1e-3


def test_gru_init_takes_either_cell():
    report = build_decoder("gru_init", GRUInitConfig(embed=8, hidden=6, cell="report"), 20, 5)
    torch_cell = build_decoder("gru_init", GRUInitConfig(embed=8, hidden=6), 20, 5)
    assert isinstance(report.gru, ReportGRUCell) and isinstance(torch_cell.gru, torch.nn.GRUCell)
    ctx = report.encode(torch.randn(3, 4, 5), torch.ones(3, 4, dtype=torch.bool))
    logits, (h,), _ = report.step(torch.tensor([1, 2, 3]), report.init_state(ctx, 3), ctx)
    assert logits.shape == (3, 20) and h.shape == (3, 6)
