"""Decoders and decoding: overfitting, the shared step, greedy/sample/beam agreements."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import Tensor

from pipeline.captions.prepared import load_captions
from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID
from pipeline.core.errors import CapstackError
from trainer.data import caption_tensor
from trainer.decoding import beam_search, greedy, picked_logprobs, sample
from trainer.decoding.words import ending_at as _ending_at
from trainer.decoding.words import log_softmax_in_place as _log_softmax_in_place
from trainer.decoders import DECODERS
from trainer.decoders.base import Decoder, DecoderOutput, per_row
from trainer.modules.dropout import Dropout
from trainer.modules.parts_lstm import PartsLSTMCell
from trainer_fixtures import (decoder_terms, make_decoder, make_prepared, mean_xe, teacher_forced,
                              tiny_decoder_config)

NAMES = sorted(DECODERS)  # every registered decoder goes through every generic test
PAPERS = ["show_tell", "lstm3", "gru_init", "soft_attention", "hard_attention", "top_down",
          "stack_cap", "stack_cap_star", "hacap"]  # the decoders of ../shared/papers
# top_down as poojahira's implementation has it (configs/coco/bottom_up/top_down.yaml)
POOJAHIRA = {"att_activation": "relu", "weight_norm": True, "word_dropout": False}
# lstm3 as Stack-Cap's coarse LSTM reads the image: beside every word (its eq 2)
EVERY_STEP = {"image_input": "every_step"}
OVERFIT = [(name, {}) for name in NAMES] + [("top_down", POOJAHIRA), ("lstm3", EVERY_STEP)]


@pytest.fixture(scope="module")
def handful(tmp_path_factory):
    """Six shapes images, one caption each, and distinct random features per image."""
    _, prepared = make_prepared(tmp_path_factory.mktemp("p"), n_train=6, n_val=1, n_test=1)
    c = load_captions(prepared)
    rows = c.rows("train")
    captions = caption_tensor(c.labels, c.lengths)[c.label_start[rows]]
    captions = captions[:, :int((captions != PAD_ID).sum(1).max())]
    torch.manual_seed(0)
    feats = torch.randn(len(rows), 4, 16)
    mask = torch.ones(len(rows), 4, dtype=torch.bool)
    mask[0, 3:] = False  # one padded location
    return feats, mask, captions, len(c.vocab)


def test_registry_lists_every_decoder_with_a_summary():
    assert set(PAPERS) <= set(DECODERS)
    assert all(summary for _, summary in DECODERS.summaries())
    with pytest.raises(CapstackError, match="unknown decoder 'nope'.*top_down"):
        DECODERS.get("nope")
    with pytest.raises(CapstackError, match="registered twice"):
        DECODERS.register("top_down")(object)


def test_decoder_config_is_strict():
    with pytest.raises(CapstackError, match="unknown key 'hiden'"):
        make_decoder("top_down", {"hiden": 3}, 10, 4)
    with pytest.raises(CapstackError, match="hidden: expected int"):
        make_decoder("top_down", {"hidden": "big"}, 10, 4)


@pytest.mark.parametrize("name, settings", OVERFIT,
                         ids=[name + ("+" + "+".join(s) if s else "") for name, s in OVERFIT])
def test_each_decoder_overfits_a_handful_of_captions(handful, name, settings):
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(0)
    model = make_decoder(name, {**tiny_decoder_config(name), **settings, "dropout": 0.0},
                         vocab_size, 16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    targets = captions[:, 1:]
    for _ in range(600):  # stops as soon as the captions are learnt (lstm3 needs ~450 steps)
        out = teacher_forced(model, feats, mask, captions)
        loss = mean_xe(out.logits, targets)
        if loss.item() < 0.01:
            break
        total = loss + decoder_terms(model, out, targets, mask)
        opt.zero_grad()
        total.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        final = mean_xe(teacher_forced(model, feats, mask, captions).logits, targets).item()
        decoded = greedy(model, model.encode(feats, mask), captions.shape[1])
    assert final < 0.05, final
    expected = [row[1:].tolist() for row in captions]
    got = [row[:len(e)].tolist() for row, e in zip(decoded.tokens, expected)]
    assert got == expected


def test_an_image_read_at_every_step_decodes_as_it_teacher_forces(handful):
    """lstm3 with the image beside every word: teacher forcing = stepping, beam 1 = greedy, and
    each step reads the image (another image changes every step's logits, from a zero state)."""
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(3)
    model = make_decoder("lstm3", {**tiny_decoder_config("lstm3"), **EVERY_STEP}, vocab_size,
                         16).eval()
    with torch.no_grad():
        forced = teacher_forced(model, feats, mask, captions)
        ctx = model.encode(feats, mask)
        state, stepped = model.init_state(ctx, captions.shape[0]), []
        assert not any(s.any() for s in state)
        for t in range(captions.shape[1] - 1):
            logits, state, _ = model.step(captions[:, t], state, ctx)
            stepped.append(logits)
        torch.testing.assert_close(forced.logits, torch.stack(stepped, 1), atol=1e-5, rtol=1e-5)
        g, b = greedy(model, ctx, 8), beam_search(model, ctx, 1, 8)
        other = teacher_forced(model, feats.roll(1, 0), mask.roll(1, 0), captions)
    assert torch.equal(g.tokens, b.tokens)
    assert (other.logits - forced.logits).abs().amax(-1).gt(1e-6).all()


@pytest.mark.parametrize("name", NAMES)
def test_attention_rows_are_distributions_over_valid_locations(handful, name):
    feats, mask, captions, vocab_size = handful
    model = make_decoder(name, tiny_decoder_config(name), vocab_size, 16).eval()
    out = teacher_forced(model, feats, mask, captions)
    assert out.logits.shape == (len(captions), captions.shape[1] - 1, vocab_size)
    if not model.has_attention:
        assert out.alphas is None
        return
    assert torch.allclose(out.alphas.sum(-1), torch.ones(out.alphas.shape[:2]), atol=1e-5)
    assert (out.alphas[0, :, 3] == 0).all()  # the padded location of image 0


@pytest.mark.parametrize("name", ["show_tell", "soft_attention", "top_down", "hard_attention",
                                  "stack_cap", "hacap"])
def test_beam_of_one_equals_greedy(handful, name):
    feats, mask, _, vocab_size = handful
    torch.manual_seed(1)
    model = make_decoder(name, tiny_decoder_config(name), vocab_size, 16).eval()
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        g, b = greedy(model, ctx, 8), beam_search(model, ctx, 1, 8)
    assert torch.equal(g.tokens, b.tokens)
    assert torch.allclose(g.logprobs, b.logprobs, atol=1e-5)
    if g.alphas is not None:
        assert torch.allclose(g.alphas, b.alphas)


@pytest.mark.parametrize("name", NAMES)
def test_teacher_forcing_gives_the_logits_of_the_step_by_step_decoder(handful, name):
    """Teacher forcing (words embedded and projected for all steps at once where a decoder
    splits its step) computes what the step decoding paths compute, to float rounding."""
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(2)
    model = make_decoder(name, tiny_decoder_config(name), vocab_size, 16).eval()
    with torch.no_grad():
        forced = teacher_forced(model, feats, mask, captions)
        ctx = model.encode(feats, mask)
        state, stepped = model.init_state(ctx, captions.shape[0]), []
        for t in range(captions.shape[1] - 1):
            logits, state, _ = model.step(captions[:, t], state, ctx)
            stepped.append(logits)
    torch.testing.assert_close(forced.logits, torch.stack(stepped, 1), atol=1e-5, rtol=1e-5)


def test_parts_lstm_cell_is_the_lstm_cell_of_the_concatenated_parts_and_loads_its_weights():
    """PartsLSTMCell computes nn.LSTMCell's (h, c) on [a, b, c] with a as the step's input and
    b, c projected ahead, from the very weights an nn.LSTMCell saved (old checkpoints load)."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(2 + 3 + 4, 5)
    parts = PartsLSTMCell({"a": 2, "b": 3, "c": 4}, ["a"], 5)
    parts.load_state_dict(cell.state_dict())
    a, b, c = torch.randn(6, 2), torch.randn(6, 3), torch.randn(6, 4)
    state = torch.randn(6, 5), torch.randn(6, 5)
    expected = cell(torch.cat([a, b, c], 1), state)
    got = parts([a], parts.project("b", b, with_bias=True) + parts.project("c", c), state)
    torch.testing.assert_close(got, expected)
    assert {k: tuple(v.shape) for k, v in parts.state_dict().items()} == {
        "step_weight": (20, 2 + 5), "bias": (20,), "ahead.b": (20, 3), "ahead.c": (20, 4)}
    with pytest.raises(ValueError, match=r"step parts \['x'\]"):
        PartsLSTMCell({"a": 2}, ["x"], 5)


def test_dropout_keeps_a_bernoulli_share_scaled_as_torchs_and_passes_its_gradient():
    torch.manual_seed(0)
    drop, x = Dropout(0.3), torch.randn(200, 500, requires_grad=True)
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01  # 100k draws: sd 0.0014
    torch.testing.assert_close(y[kept], x[kept] / 0.7)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.7)
    assert not torch.equal(drop(x), y)  # a new mask each call
    assert torch.equal(drop.eval()(x), x)
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))


class TableDecoder(Decoder):
    """A tiny decoder whose next-word distribution depends on the previous word and image."""

    has_attention = False

    def __init__(self, vocab_size: int, seed: int):
        super().__init__(None, vocab_size, 1)
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(2, vocab_size, vocab_size, generator=g) * 2

    def encode(self, feats, mask):
        return {"image": feats[:, 0, 0].long()}

    def init_state(self, ctx, rows):
        return (per_row(ctx["image"], rows),)

    def step(self, words, state, ctx):
        return self.table[state[0], words], state, None


def enumerate_best(model: TableDecoder, image: int, max_len: int) -> tuple[list[int], float]:
    """The best caption by brute force: m <= max_len words, then <eos>."""
    words = [w for w in range(model.vocab_size) if w != EOS_ID]
    logp = torch.log_softmax(model.table[image], -1)
    candidates = [list(seq) + [EOS_ID] for m in range(max_len + 1)
                  for seq in itertools.product(words, repeat=m)]

    def score(seq):
        return sum(float(logp[prev, w]) for prev, w in zip([BOS_ID] + seq[:-1], seq))

    best = max(candidates, key=score)
    return best, score(best)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_finds_the_best_sequence_of_an_enumerable_model(seed):
    model = TableDecoder(vocab_size=6, seed=seed)
    feats = torch.tensor([[[0.0]], [[1.0]]])
    ctx = model.encode(feats, torch.ones(2, 1, dtype=torch.bool))
    max_len = 3
    result = beam_search(model, ctx, beam_size=5 ** 3, max_len=max_len)  # every live prefix
    for image in (0, 1):
        expected, score = enumerate_best(model, image, max_len)
        got = result.tokens[image].tolist()[:len(expected)]
        assert got == expected
        assert result.scores[image].item() == pytest.approx(score, abs=1e-4)
    small = beam_search(model, ctx, beam_size=2, max_len=max_len)  # never better than exact
    assert (small.scores <= result.scores + 1e-5).all()


class NeverEnds(TableDecoder):
    """A model that gives <eos> the least probability at every step."""

    def step(self, words, state, ctx):
        logits, state, alpha = super().step(words, state, ctx)
        return logits.index_fill(1, torch.tensor([EOS_ID]), -30.0), state, alpha


@pytest.mark.parametrize("decode", ["greedy", "sample", "beam"])
def test_no_decode_path_writes_more_than_max_len_words(decode):
    model = NeverEnds(vocab_size=6, seed=0)
    ctx = model.encode(torch.tensor([[[0.0]], [[1.0]]]), torch.ones(2, 1, dtype=torch.bool))
    max_len = 4
    out = {"greedy": lambda: greedy(model, ctx, max_len),
           "sample": lambda: sample(model, ctx, max_len, n=3),
           "beam": lambda: beam_search(model, ctx, 3, max_len)}[decode]()
    assert out.tokens.shape[1] == max_len + 1
    assert (out.tokens[:, max_len] == EOS_ID).all()  # cut: max_len words, then <eos>
    assert (out.tokens[:, :max_len] != EOS_ID).all()
    images = torch.arange(2).repeat_interleave(out.tokens.shape[0] // 2)
    logits, _, _ = model.step(out.tokens[:, max_len - 1], (images,), ctx)
    logp_eos = torch.log_softmax(logits, 1)[:, EOS_ID]
    assert torch.allclose(out.logprobs[:, max_len], logp_eos)  # the model's own P(<eos>)


def test_sampling_is_seeded_and_temperature_sharpens(handful):
    feats, mask, _, vocab_size = handful
    torch.manual_seed(0)  # these weights, whatever ran before: at every greedy step the best
    # word's logit leads the next by 6.7e-4 or more, so at temperature 1e-6 a draw is the argmax
    model = make_decoder("top_down", tiny_decoder_config("top_down"), vocab_size, 16).eval()
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        torch.manual_seed(5)
        a = sample(model, ctx, 6, n=3)
        torch.manual_seed(5)
        b = sample(model, ctx, 6, n=3)
        cold = sample(model, ctx, 6, temperature=1e-6)
        g = greedy(model, ctx, 6)
    assert a.tokens.shape[0] == 3 * len(feats) and torch.equal(a.tokens, b.tokens)
    assert torch.equal(cold.tokens, g.tokens)


def test_sampled_logprobs_carry_gradients(handful):
    feats, mask, _, vocab_size = handful
    model = make_decoder("soft_attention", tiny_decoder_config("soft_attention"), vocab_size, 16)
    out = sample(model, model.encode(feats, mask), 5)
    out.scores.sum().backward()
    assert model.word_embed.weight.grad is not None


def hard_attention(vocab_size: int, **settings):
    return make_decoder("hard_attention", {**tiny_decoder_config("hard_attention"), **settings},
                        vocab_size, 16)


def test_hard_attention_baseline_follows_the_moving_average(handful):
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(0)
    model = hard_attention(vocab_size, expectation=0.0)  # every caption sampled
    targets = captions[:, 1:]
    out = teacher_forced(model, feats, mask, captions)
    assert (set(out.extras) == {"location_logp", "entropy", "sampled"}
            and out.extras["sampled"].all())
    token_logp = -torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), targets,
                                                    reduction="none")
    logp = (token_logp * (targets != 0)).sum(1).mean().item()
    terms = model.loss_terms(out, targets, targets != 0, mask)
    model.loss_terms(out, targets, targets != 0, mask)
    assert float(model.baseline) == 0  # computing the loss (twice) moves nothing
    assert terms.observed["sentence_logp"].item() == pytest.approx(logp * len(targets), rel=1e-4)
    means = {k: v / len(targets) for k, v in terms.observed.items()}  # as the objective hands them
    model.update(means)
    assert float(model.baseline) == pytest.approx(0.1 * logp, rel=1e-4)  # b_1 = 0.9*0 + 0.1 log p
    model.update(means)
    # b_2 = 0.9 b_1 + 0.1 log p
    assert float(model.baseline) == pytest.approx(0.19 * logp, rel=1e-4)
    model.eval()
    # the expected context at test time
    assert teacher_forced(model, feats, mask, captions).extras == {}


def contexts_fed(model, feats, mask, captions) -> tuple[Tensor, DecoderOutput]:
    """Every z_t the LSTM was given in a teacher-forced pass [N, T, D], and the output."""
    fed, advance = [], model.advance
    model.advance = lambda words, state, z: (fed.append(z.detach()), advance(words, state, z))[1]
    out = teacher_forced(model, feats, mask, captions)
    return torch.stack(fed, 1), out


def test_hard_attention_feeds_the_sampled_annotation_itself(handful):
    """z_t = sum_i s_ti a_i: one of the image's annotation vectors, no gate beta."""
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(1)
    model = hard_attention(vocab_size, expectation=0.0)
    assert model.gate is None
    fed, _ = contexts_fed(model, feats, mask, captions)
    annotations = feats.repeat_interleave(len(captions) // len(feats), 0)  # [N, L, D]
    distance = (fed[:, :, None, :] - annotations[:, None, :, :]).abs().amax(-1)  # [N, T, L]
    assert (distance.amin(-1) == 0).all()


def test_hard_attention_expectation_trains_on_the_expected_context_without_reinforce(handful):
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(2)
    model = hard_attention(vocab_size, expectation=1.0, entropy=0.5)
    fed, out = contexts_fed(model, feats, mask, captions)
    annotations = feats.repeat_interleave(len(captions) // len(feats), 0)
    expected = (out.alphas[..., None] * annotations[:, None]).sum(2)  # sum_i alpha_ti a_i
    assert torch.allclose(fed, expected.detach(), atol=1e-6) and not out.extras["sampled"].any()
    targets = captions[:, 1:]
    terms = model.loss_terms(out, targets, targets != 0, mask)
    entropy = (out.extras["entropy"] * (targets != 0)).sum()
    assert terms.summed.item() == pytest.approx(-0.5 * entropy.item(), rel=1e-5)  # no REINFORCE
    model.update({k: v / len(targets) for k, v in terms.observed.items()})
    assert float(model.baseline) == 0  # nothing sampled: the baseline stays


def test_doubly_stochastic_penalty_matches_the_formula(handful):
    feats, mask, captions, vocab_size = handful
    model = make_decoder("soft_attention", {**tiny_decoder_config("soft_attention"),
                                              "doubly_stochastic": 0.5}, vocab_size, 16)
    targets = captions[:, 1:]
    out = teacher_forced(model, feats, mask, captions)
    alphas, steps = out.alphas.detach().numpy(), (targets != 0).numpy()
    expected = np.mean([0.5 * sum((1 - alphas[n, steps[n], i].sum()) ** 2
                                  for i in range(4) if mask[n, i])
                        for n in range(len(captions))])
    got = model.loss_terms(out, targets, targets != 0, mask).summed.item() / len(captions)
    assert got == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("name", ["stack_cap", "stack_cap_star"])
def test_stack_cap_loss_is_the_sum_of_its_stages(handful, name):
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(0)
    model = make_decoder(name, {**tiny_decoder_config(name), "fine_stages": 2}, vocab_size, 16)
    model.eval()
    targets = captions[:, 1:]
    out = teacher_forced(model, feats, mask, captions)
    assert out.extras["stage_logits"].shape[0] == 3 and out.extras["stage_alphas"].shape[0] == 2
    total = mean_xe(out.logits, targets) + decoder_terms(model, out, targets, mask)
    per_stage = [mean_xe(logits, targets) for logits in out.extras["stage_logits"]]
    assert total.item() == pytest.approx(sum(p.item() for p in per_stage), rel=1e-6)
    # each stage decodes its own caption; the default head is the last stage
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        final = greedy(model, ctx, 6)
        with model.heading(0):
            coarse = greedy(model, ctx, 6)
            assert coarse.alphas is not None
        assert torch.equal(greedy(model, ctx, 6).tokens, final.tokens)


def test_stack_cap_stacking_changes_only_the_attention_query(handful):
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(0)
    stacked = make_decoder("stack_cap", tiny_decoder_config("stack_cap"), vocab_size, 16).eval()
    star = make_decoder("stack_cap_star", tiny_decoder_config("stack_cap_star"), vocab_size, 16)
    star.load_state_dict(stacked.state_dict())  # the same parameters
    star.eval()
    a, b = (teacher_forced(stacked, feats, mask, captions),
            teacher_forced(star, feats, mask, captions))
    sa, sb = a.extras["stage_logits"], b.extras["stage_logits"]
    # at the first step the coarse stage and the first fine stage agree (alpha^0 = 0 in both);
    # the second fine stage attends with h^1 + g^1 (eq 8) against h^1 alone
    assert torch.allclose(sa[:2, :, 0], sb[:2, :, 0])
    assert not torch.allclose(sa[2, :, 0], sb[2, :, 0])


@pytest.mark.parametrize("name", ["top_down", "stack_cap", "stack_cap_star"])
def test_feature_embedding_feeds_the_lstms_embedded_features(handful, name):
    """feature_embed: the LSTMs and attention read ReLU(W v) of that size, and it still learns."""
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(0)
    model = make_decoder(name, {**tiny_decoder_config(name), "dropout": 0.0, "feature_embed": 8},
                          vocab_size, 16)
    first_lstm = model.attention_lstm if name == "top_down" else model.coarse
    assert model.feature_embed[0].in_features == 16
    assert first_lstm.input_size == model.config.hidden + 8 + model.config.embed
    ctx = model.encode(feats, mask)
    assert ctx["mean"].shape[-1] == 8 and (ctx["mean"] >= 0).all()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    targets = captions[:, 1:]
    for _ in range(400):
        loss = mean_xe(teacher_forced(model, feats, mask, captions).logits, targets)
        if loss.item() < 0.05:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def hand_set_attention(settings: dict):
    """top_down's attention on two 2-d regions, its weights set by hand: W_va = I, b = 0,
    W_ha = [-2, 1]^T (a 1-unit h1), w_a = [1, 1]."""
    model = make_decoder("top_down", {"embed": 4, "hidden": 1, "att_hidden": 2, **settings},
                         10, 2)
    att = model.attention
    with torch.no_grad():
        att.feature_proj.weight.copy_(torch.eye(2))
        att.feature_proj.bias.zero_()
        att.query_proj.weight.copy_(torch.tensor([[-2.0], [1.0]]))
        att.score.weight.copy_(torch.tensor([[1.0, 1.0]]))
    return model


def test_top_down_relu_attention_is_poojahiras_on_a_hand_computed_case():
    """``att_activation: relu`` is poojahira's a_i = w_a^T dropout(ReLU(W_va v_i + W_ha h1))
    (models.py:36 there); the default is eq. (3)'s tanh. With v_1 = [1, 0], v_2 = [0, 1] and
    h1 = 1, W_va v_i + W_ha h1 is [-1, 1] and [-2, 2]: tanh's scores cancel to (0, 0), ReLU's
    are (1, 2)."""
    feats, mask, h1 = torch.eye(2)[None], torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 1)

    def alpha(model):
        return model.attention(model.attention.project(feats), feats, mask, h1)[1]

    e = math.e
    torch.testing.assert_close(alpha(hand_set_attention({}).eval()), torch.tensor([[0.5, 0.5]]))
    relu = hand_set_attention({"att_activation": "relu", "att_dropout": 0.5})
    torch.testing.assert_close(alpha(relu.eval()), torch.tensor([[1 / (1 + e), e / (1 + e)]]))
    # training: ReLU's outputs [0, 1] and [0, 2] dropped or doubled, so a_1 in {0, 2}, a_2 in {0, 4}
    relu.train()
    possible = torch.tensor([1 / (1 + math.exp(a2 - a1)) for a1 in (0, 2) for a2 in (0, 4)])
    drawn = set()
    for seed in range(20):
        torch.manual_seed(seed)
        first = alpha(relu)[0, 0]
        assert torch.isclose(possible, first).any(), first
        drawn.add(int(torch.isclose(possible, first).nonzero()[0]))
    assert drawn == {0, 1, 2, 3}


def test_top_down_as_poojahiras_weight_normalises_and_keeps_the_words_undropped(handful):
    """``weight_norm``: W_va, W_ha, w_a and W_p are g v / ||v|| per output row (models.py:20-22,
    73 there); ``word_dropout: false``: dropout on h2 alone, not on W_e Pi_t (models.py:116)."""
    _, _, captions, vocab_size = handful
    settings = {**tiny_decoder_config("top_down"), "dropout": 0.5}
    model = make_decoder("top_down", {**settings, **POOJAHIRA}, vocab_size, 16).train()
    att = model.attention
    for layer in (att.feature_proj, att.query_proj, att.score, model.out):
        g, v = layer.parametrizations.weight.original0, layer.parametrizations.weight.original1
        torch.testing.assert_close(layer.weight, g * v / v.norm(dim=1, keepdim=True))
    words = captions[:, 0]
    assert torch.equal(model.embed_words(words), model.embed_words(words))
    default = make_decoder("top_down", settings, vocab_size, 16).train()
    assert not torch.equal(default.embed_words(words), default.embed_words(words))
    assert not any("parametrizations" in k for k in default.state_dict())


def test_sampling_noise_draws_each_row_by_its_own_uniform():
    """Inverse-CDF sampling with SamplingNoise: a row's word depends on its draw alone (not on
    which rows are sampled with it), and the words follow the distribution."""
    from trainer.decoding import SamplingNoise

    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    model = _FixedDistribution(probs)
    ctx = {"x": torch.zeros(4000, 1)}
    whole = sample(model, ctx, 1, noise=SamplingNoise((7,), 4000)).tokens[:, 0]
    part = sample(model, {"x": torch.zeros(1000, 1)}, 1,
                  noise=SamplingNoise((7,), 4000, offset=3000)).tokens[:, 0]
    assert torch.equal(whole[3000:], part)
    freq = torch.bincount(whole, minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)


class _FixedDistribution(Decoder):
    """Every step: the same next-word distribution."""

    def __init__(self, probs):
        super().__init__(None, len(probs), 1)
        self.logits = torch.log(probs)

    def init_state(self, ctx, rows):
        return (per_row(ctx["x"], rows),)

    def step(self, words, state, ctx):
        return self.logits.expand(words.shape[0], -1), state, None


def test_show_tell_trains_on_a_batch_of_one_image():
    """im2txt's batch norm: one image (an epoch's last batch, or a DDP rank's part) is
    normalised with the running statistics instead of failing."""
    model = make_decoder("show_tell", tiny_decoder_config("show_tell"), 12, 8).train()
    feats, mask = torch.randn(1, 3, 8), torch.ones(1, 3, dtype=torch.bool)
    captions = torch.tensor([[BOS_ID, 5, 6, EOS_ID]])
    loss = mean_xe(teacher_forced(model, feats, mask, captions).logits, captions[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and model.image_embed[0].weight.grad is not None


def test_stack_caps_coarse_loss_reaches_the_fine_stages_through_eq_2(handful):
    """h^{Nf}_{t-1} feeds the coarse LSTM (eq 2): stage 0's loss has gradients in the fine stages'
    LSTMs (not only in theta_0, as eqs 9-14 would read), but none in their output layers."""
    feats, mask, captions, vocab_size = handful
    torch.manual_seed(0)
    model = make_decoder("stack_cap", {**tiny_decoder_config("stack_cap"), "fine_stages": 2},
                         vocab_size, 16)
    out = teacher_forced(model, feats, mask, captions)
    coarse = out.extras["stage_logits"][0]
    mean_xe(coarse, captions[:, 1:]).backward()
    assert model.fine[-1].step_weight.grad.abs().sum() > 0
    untouched = model.outputs[-1].weight.grad
    assert untouched is None or untouched.abs().sum() == 0


@pytest.mark.parametrize("t", [3, 5])
def test_picked_logprobs_have_the_gradient_of_log_softmax_then_gather(t):
    """Sampling's log p(w) takes its gradient, onehot(w) - softmax(logits), in its own
    backward: equal to autograd's through log_softmax and gather, at the last step too, where
    only <eos> may follow but its log-probability is the model's unmasked one."""
    torch.manual_seed(0)
    logits = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)
    words = torch.full((6,), EOS_ID) if t == 5 else torch.randint(0, 11, (6,))
    done = torch.tensor([False] * 5 + [True])
    weights = torch.randn(6, dtype=torch.float64)
    expected = _ending_at(t, 5, torch.log_softmax(logits, 1)).gather(1, words[:, None])[:, 0]
    expected = expected.masked_fill(done, 0)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    with torch.no_grad():
        full = torch.log_softmax(logits, 1)
    got = picked_logprobs(logits, full, words).masked_fill(done, 0)
    (got_grad,) = torch.autograd.grad((got * weights).sum(), logits)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_grad, expected_grad)


def test_beam_search_log_softmax_is_taken_in_place_only_on_a_tensor_nothing_else_reads():
    """A step's own logits become their log-softmax in their memory (beam search reads them once);
    logits that a graph needs, or a view into a larger tensor, are left as they were."""
    torch.manual_seed(0)
    logits = torch.randn(4, 30) * 5
    expected = torch.log_softmax(logits, 1)
    own = logits.clone()
    got = _log_softmax_in_place(own)
    assert got.data_ptr() == own.data_ptr() and torch.equal(got, expected)
    bigger = torch.cat([logits, logits])
    view = bigger[:4]
    assert torch.equal(_log_softmax_in_place(view), expected)
    assert torch.equal(bigger[:4], logits)  # the larger tensor untouched
    graphed = logits.clone().requires_grad_() * 1
    assert torch.equal(_log_softmax_in_place(graphed), expected)
    assert torch.equal(graphed, logits)
