"""Teacher forcing's fast path (issue 35) computes what ``step`` computes one word at a time.

Every registered decoder's teacher-forced forward (words embedded and projected for all steps
at once, the recurrence alone, the vocabulary projection on every step in one product) is
compared with stepping ``step`` over the same words: logits, attention, the extras a step can
show (Stack-Cap's stages, HACap's goals) and the gradients of a loss on them, at small sizes.
With dropout off (eval), and on, with a dropout whose mask is fixed by the position in the
last dimension, so both paths drop the same units wherever they place dropout alike.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from pipeline.captions.vocab import BOS_ID
from trainer.decoders import DECODERS
from trainer.decoders.base import StagedDecoder
from trainer.modules.dropout import Dropout
from trainer.modules.gru import GRUCell
from trainer.modules.parts_lstm import PartsLSTMCell
from trainer.modules.report_gru import ReportGRUCell
from trainer_fixtures import make_decoder, tiny_decoder_config

NAMES = sorted(DECODERS)
VOCAB, DIM, IMAGES, PER_IMAGE, WORDS = 20, 16, 3, 2, 6
# the transformer's attention weights are dropped inside scaled_dot_product_attention, which a
# fixed mask cannot reach
RECURRENT = [name for name in NAMES if name != "transformer"]
# decoders whose settings change how the fast path runs: gru_init's other cell, Stack-Cap*
VARIANTS = [(name, {}) for name in NAMES] + [("gru_init", {"cell": "report"})]


def inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """feats [3, 5, 16] with one padded location, captions [6, 7] (<bos> then random words)."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(IMAGES, 5, DIM, generator=g)
    mask = torch.ones(IMAGES, 5, dtype=torch.bool)
    mask[0, 4:] = False
    captions = torch.randint(4, VOCAB, (IMAGES * PER_IMAGE, WORDS + 1), generator=g)
    captions[:, 0] = BOS_ID
    return feats, mask, captions


def build(name: str, settings: dict, seed: int = 0):
    torch.manual_seed(seed)
    return make_decoder(name, {**tiny_decoder_config(name), **settings}, VOCAB, DIM)


def context(model, feats, mask):
    return model.encode(feats, mask)  # per image; the captions come PER_IMAGE each


def forced(model, feats, mask, captions) -> dict[str, Tensor]:
    """What teacher forcing gives, by the names :func:`stepped` uses."""
    out = model(context(model, feats, mask), captions)
    got = {"logits": out.logits}
    if out.alphas is not None:
        got["alphas"] = out.alphas
    if isinstance(model, StagedDecoder):
        for stage in range(model.stages):
            got[f"logits{stage}"] = out.extras["stage_logits"][stage]
            if stage:
                got[f"alphas{stage}"] = out.extras["stage_alphas"][stage - 1]
    if "goals" in out.extras:
        got["goals"] = out.extras["goals"]
    return got


def step_by_step(model, ctx, captions) -> dict[str, Tensor]:
    """``step`` over the caption's words: logits [N, T, V], alphas, and HACap's goal of each
    step (the newest in its state)."""
    state, per_step = model.init_state(ctx, captions.shape[0]), []
    for t in range(captions.shape[1] - 1):
        logits, state, alpha = model.step(captions[:, t], state, ctx)
        step = {"logits": logits}
        if alpha is not None:
            step["alphas"] = alpha
        if model.__class__.__name__ == "HACap":
            step["goals"] = state[4][:, -1]
        per_step.append(step)
    return {key: torch.stack([s[key] for s in per_step], 1) for key in per_step[0]}


def stepped(model, feats, mask, captions) -> dict[str, Tensor]:
    """:func:`forced`'s names from stepping: a staged decoder's every stage as the head."""
    got = step_by_step(model, context(model, feats, mask), captions)
    if isinstance(model, StagedDecoder):
        for stage in range(model.stages):
            with model.heading(stage):
                staged = step_by_step(model, context(model, feats, mask), captions)
            got[f"logits{stage}"] = staged["logits"]
            if stage:
                got[f"alphas{stage}"] = staged["alphas"]
    return got


def loss_of(outputs: dict[str, Tensor]) -> Tensor:
    """A loss that weighs every output differently (fixed weights), so gradients see each."""
    g = torch.Generator().manual_seed(7)
    return sum((value * torch.randn(value.shape, generator=g).to(value.device)).sum()
               for _, value in sorted(outputs.items()))


def outputs_and_gradients(model, path, feats, mask, captions):
    model.zero_grad(set_to_none=True)
    outputs = path(model, feats, mask, captions)
    loss_of(outputs).backward()
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)).clone()
             for name, p in model.named_parameters()}
    return {k: v.detach() for k, v in outputs.items()}, grads


def assert_paths_agree(model, feats, mask, captions):
    fast, fast_grads = outputs_and_gradients(model, forced, feats, mask, captions)
    slow, slow_grads = outputs_and_gradients(model, stepped, feats, mask, captions)
    assert fast.keys() == slow.keys()
    for key in fast:
        torch.testing.assert_close(fast[key], slow[key], atol=1e-5, rtol=1e-5, msg=key)
    for name in fast_grads:
        torch.testing.assert_close(fast_grads[name], slow_grads[name], atol=1e-5, rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert any(g.abs().sum() > 0 for g in fast_grads.values())


VARIANT_IDS = [n + "".join(f"+{v}" for v in s.values()) for n, s in VARIANTS]


@pytest.mark.parametrize("name, settings", VARIANTS, ids=VARIANT_IDS)
def test_teacher_forcing_equals_stepping_logits_attention_extras_and_gradients(name, settings):
    model = build(name, {**settings, "dropout": 0.0}).eval()
    assert_paths_agree(model, *inputs())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
@pytest.mark.parametrize("name, settings", VARIANTS, ids=VARIANT_IDS)
def test_on_a_gpu_teacher_forcing_equals_stepping(name, settings, monkeypatch):
    """The same on CUDA (cuDNN's LSTM over a whole caption, float32 products without TF32), in
    training mode without dropout: cuDNN's RNN has no backward in evaluation mode."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    expected = {"expectation": 1.0} if name == "hard_attention" else {}
    model = build(name, {**settings, **expected, "dropout": 0.0}).cuda().train()
    assert_paths_agree(model, *(x.cuda() for x in inputs()))


def fixed_dropout(self, x: Tensor) -> Tensor:
    """Dropout whose kept units are fixed by their index in the last dimension (2 in 3 kept,
    scaled as dropout scales): the same mask for a step's [N, E] and every step's [T, N, E]."""
    if not self.training or self.p == 0:
        return x
    keep = (torch.arange(x.shape[-1], device=x.device) % 3 != 0).to(x.dtype)
    return x * keep / (2 / 3)


@pytest.mark.parametrize("name", RECURRENT)
def test_with_dropout_both_paths_drop_the_same_places(name, monkeypatch):
    """Training mode, dropout 0.5 everywhere it is placed, the fixed mask: the fast path drops
    what the step drops (hard attention trains on the expected context here, every caption)."""
    monkeypatch.setattr(Dropout, "forward", fixed_dropout)
    monkeypatch.setattr(nn.Dropout, "forward", fixed_dropout)
    settings = {"dropout": 0.5, **({"expectation": 1.0} if name == "hard_attention" else {})}
    model = build(name, settings).train()
    if isinstance(getattr(model, "lstm", None), nn.LSTM):
        model.lstm.dropout = 0.0  # lstm3's between layers: nn.LSTM's own, random draws
    feats, mask, captions = inputs(1)
    assert_paths_agree(model, feats, mask, captions)
    model.eval()
    with torch.no_grad():
        undropped = forced(model, feats, mask, captions)["logits"]
    model.train()
    with torch.no_grad():
        assert not torch.allclose(forced(model, feats, mask, captions)["logits"], undropped)


def test_hard_attention_sampled_extras_are_per_step():
    """Training on sampled locations: H[s_t] and log p(s_t) for every step [N, T], computed
    from the stacked alphas (log p(s_t) of a location, so at most 0)."""
    model = build("hard_attention", {"dropout": 0.0, "expectation": 0.0}).train()
    feats, mask, captions = inputs()
    out = model(context(model, feats, mask), captions)
    n, t = captions.shape[0], captions.shape[1] - 1
    assert out.logits.shape == (n, t, VOCAB) and out.extras["sampled"].all()
    assert out.extras["entropy"].shape == out.extras["location_logp"].shape == (n, t)
    alphas = out.alphas
    torch.testing.assert_close(out.extras["entropy"],
                               -(alphas * torch.log(alphas.clamp(min=1e-12))).sum(2))
    assert (out.extras["location_logp"] <= 0).all()


def lstm_cell_parameters(cell: PartsLSTMCell) -> dict[str, Tensor]:
    """A PartsLSTMCell's weights as the nn.LSTMCell on its concatenated parts would hold them
    (both biases summed into bias_ih)."""
    steps = cell.step_weight.split([cell.parts[p] for p in cell.step_parts] + [cell.hidden_size], 1)
    blocks = {**dict(zip(cell.step_parts, steps)), **dict(cell.ahead.items())}
    return {"weight_ih": torch.cat([blocks[p] for p in cell.parts], 1), "weight_hh": steps[-1],
            "bias_ih": cell.bias.detach(), "bias_hh": torch.zeros_like(cell.bias)}


def test_parts_lstm_cell_draws_nn_lstm_cells_initial_weights():
    """The same seed gives a PartsLSTMCell the very weights it gives an nn.LSTMCell, and the
    generator ends where nn.LSTMCell leaves it (the decoder's later layers draw the same)."""
    torch.manual_seed(4)
    cell, after = nn.LSTMCell(2 + 3 + 4, 5), torch.rand(3)
    torch.manual_seed(4)
    parts, parts_after = PartsLSTMCell({"a": 2, "b": 3, "c": 4}, ["a", "c"], 5), torch.rand(3)
    assert torch.equal(after, parts_after)
    expected = dict(cell.named_parameters())
    for name, value in lstm_cell_parameters(parts).items():
        if name == "bias_ih":
            torch.testing.assert_close(value, expected["bias_ih"] + expected["bias_hh"])
        elif name != "bias_hh":
            assert torch.equal(value, expected[name]), name


@pytest.mark.parametrize("name", ["soft_attention", "hard_attention", "stack_cap",
                                  "stack_cap_star", "top_down"])
def test_state_dicts_of_the_nn_lstm_cell_layout_still_load(name):
    """A decoder whose LSTMs were nn.LSTMCell loads their weights (old checkpoints), split into
    the parts cells' blocks, and computes what the saved decoder computes."""
    model = build(name, {"dropout": 0.0}).eval()
    state = model.state_dict()
    for prefix, cell in model.named_modules():
        if isinstance(cell, PartsLSTMCell):
            for key in ["step_weight", "bias", *(f"ahead.{part}" for part in cell.ahead)]:
                del state[f"{prefix}.{key}"]
            state.update({f"{prefix}.{k}": v for k, v in lstm_cell_parameters(cell).items()})
    assert any(key.endswith("weight_ih") for key in state)
    loaded = build(name, {"dropout": 0.0}, seed=1).eval()
    loaded.load_state_dict(state)
    feats, mask, captions = inputs()
    with torch.no_grad():
        torch.testing.assert_close(forced(loaded, feats, mask, captions),
                                   forced(model, feats, mask, captions))


@pytest.mark.parametrize("cell", [GRUCell, ReportGRUCell])
def test_gru_cells_steps_ahead_equal_their_forward(cell):
    """project (the input's share, every step at once), then steps, is the cell called a step
    at a time; the torch cell's is nn.GRUCell's own, on the same parameters."""
    torch.manual_seed(0)
    gru = cell(3, 4)
    x, c0 = torch.randn(5, 2, 3), torch.randn(2, 4)
    expected, c = [], c0
    reference = nn.GRUCell(3, 4) if cell is GRUCell else gru
    if cell is GRUCell:
        reference.load_state_dict(gru.state_dict())
    for step in x.unbind(0):
        c = reference(step, c)
        expected.append(c)
    torch.testing.assert_close(gru.steps(gru.project(x), c0), torch.stack(expected, 1))


def test_top_down_language_lstm_reads_the_attended_regions_as_eq_4_weighs_them():
    """The language LSTM weighs each region's share of its gates, W v_i + b, by alpha_t: that is
    nn.LSTMCell on [v_hat_t, h1_t] with v_hat_t = sum_i alpha_it v_i (eq. 4), a padded region
    included (its weight is 0, the others still sum to one)."""
    model = build("top_down", {"dropout": 0.0}).eval()
    feats, mask, captions = inputs()
    ctx = model.encode(feats, mask)
    state = tuple(torch.randn(s.shape, generator=torch.Generator().manual_seed(3))
                  for s in model.init_state(ctx, captions.shape[0]))
    hidden, (h1, _, h2, c2), alpha = model.step_hidden(model.embed_words(captions[:, 1]),
                                                       state, ctx)
    v_hat = torch.bmm(alpha.view(IMAGES, PER_IMAGE, -1), ctx["feats"]).flatten(0, 1)
    reference = nn.LSTMCell(v_hat.shape[1] + h1.shape[1], h1.shape[1])
    reference.load_state_dict(lstm_cell_parameters(model.language_lstm))
    with torch.no_grad():
        expected_h2, expected_c2 = reference(torch.cat([v_hat, h1], 1), state[2:])
    torch.testing.assert_close(h2, expected_h2)
    torch.testing.assert_close(c2, expected_c2)
    assert torch.equal(hidden, h2) and (alpha[:PER_IMAGE, 4] == 0).all()
