"""The transformer decoder: one teacher-forced pass equals the cached steps, beam of one is greedy,
SCST trains it, and padded regions are never read. (It learns a few captions, and trains under
DDP, in the generic tests every registered decoder goes through: test_decoders,
test_distributed.)"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.captions.vocab import PAD_ID
from pipeline.core.errors import CapstackError
from trainer.config import load_experiment
from trainer.data import caption_tensor
from trainer.decoding import beam_search, greedy
from trainer.decoders.transformer import Transformer  # registers "transformer"
from trainer.rewards.cider_cache import build_cache
from trainer.train import train
from trainer_fixtures import make_decoder, make_prepared, teacher_forced, write_feature_store

TINY = {"d_model": 32, "heads": 4, "layers": 2, "d_ff": 64}


def tiny(vocab_size: int, feature_dim: int = 16, **settings) -> Transformer:
    return make_decoder("transformer", {**TINY, **settings}, vocab_size, feature_dim)


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    """Four shapes images, one caption each, distinct random features; image 0 has a padded
    region."""
    _, prepared = make_prepared(tmp_path_factory.mktemp("p"), n_train=4, n_val=1, n_test=1)
    c = load_captions(prepared)
    rows = c.rows("train")
    captions = caption_tensor(c.labels, c.lengths)[c.label_start[rows]]
    captions = captions[:, :int((captions != PAD_ID).sum(1).max())]
    torch.manual_seed(0)
    feats = torch.randn(len(rows), 4, 16)
    mask = torch.ones(len(rows), 4, dtype=torch.bool)
    mask[0, 3:] = False
    return feats, mask, captions, len(c.vocab)


@pytest.mark.parametrize("norm_first", [False, True])
def test_one_teacher_forced_pass_gives_the_logits_of_the_cached_steps(few, norm_first):
    feats, mask, captions, vocab_size = few
    torch.manual_seed(2)
    model = tiny(vocab_size, norm_first=norm_first).eval()
    with torch.no_grad():
        forced = teacher_forced(model, feats, mask, captions)
        ctx = model.encode(feats, mask)
        state, stepped, alphas = model.init_state(ctx, captions.shape[0]), [], []
        for t in range(captions.shape[1] - 1):
            logits, state, alpha = model.step(captions[:, t], state, ctx)
            stepped.append(logits)
            alphas.append(alpha)
            assert state[0].shape == (len(captions), 2, t + 1, 32)  # the cache grows a position
    torch.testing.assert_close(forced.logits, torch.stack(stepped, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(forced.alphas, torch.stack(alphas, 1), atol=1e-5, rtol=1e-5)
    assert torch.allclose(forced.alphas.sum(-1), torch.ones(forced.alphas.shape[:2]), atol=1e-5)
    assert (forced.alphas[0, :, 3] == 0).all()  # image 0's padded region


@pytest.mark.parametrize("norm_first", [False, True])
def test_steps_in_a_cache_with_room_keep_their_shapes_and_give_the_one_pass(few, norm_first):
    """Decoding's cache (with_room): a slot for every word, the state's shapes the same at every
    word, its logits and attention those of the growing cache and of teacher forcing; room made
    after some words keeps them."""
    feats, mask, captions, vocab_size = few
    torch.manual_seed(2)
    model = tiny(vocab_size, norm_first=norm_first).eval()
    words = captions.shape[1] - 1
    with torch.no_grad():
        forced = teacher_forced(model, feats, mask, captions)
        ctx = model.encode(feats, mask)
        state = model.init_state(ctx, captions.shape[0])
        logits, state, _ = model.step(captions[:, 0], state, ctx)  # one word grown, then room
        stepped, alphas = [logits], [None]
        state = model.with_room(state, words - 1)
        shapes = [tuple(t.shape) for t in state]
        assert shapes[0] == (len(captions), 2, words, 32) and shapes[2] == (len(captions), words)
        for t in range(1, words):
            logits, state, alpha = model.step(captions[:, t], state, ctx)
            assert [tuple(x.shape) for x in state] == shapes
            stepped.append(logits)
            alphas.append(alpha)
    assert bool(state[2].all())  # every slot filled
    torch.testing.assert_close(forced.logits, torch.stack(stepped, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(forced.alphas[:, 1:], torch.stack(alphas[1:], 1), atol=1e-5,
                               rtol=1e-5)


def test_a_feed_of_the_captions_own_words_is_the_one_pass(few):
    """Scheduled sampling's feed takes the step-by-step path: with the caption's words fed, it
    computes what the one pass does."""
    feats, mask, captions, vocab_size = few
    model = tiny(vocab_size).eval()
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        fed = model(ctx, captions, feed=lambda words, logits: words)
        forced = model(ctx, captions)
    torch.testing.assert_close(fed.logits, forced.logits, atol=1e-5, rtol=1e-5)


def test_beam_of_one_equals_greedy_and_a_wider_beam_reorders_the_cache(few):
    feats, mask, _, vocab_size = few
    torch.manual_seed(1)
    model = tiny(vocab_size).eval()
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        g, b = greedy(model, ctx, 8), beam_search(model, ctx, 1, 8)
        wide = beam_search(model, ctx, 3, 8)
    assert torch.equal(g.tokens, b.tokens)
    assert torch.allclose(g.logprobs, b.logprobs, atol=1e-5)
    assert torch.allclose(g.alphas, b.alphas)
    assert (wide.scores >= g.scores - 1e-5).all()
    # each beam's score is the model's own log-probability of its caption (a teacher-forced pass):
    # the cache followed every reordering of the hypotheses
    with torch.no_grad():
        captions = torch.cat([torch.ones(len(feats), 1, dtype=torch.long), wide.tokens], 1)
        logp = torch.log_softmax(model(ctx, captions).logits, -1)
        chosen = logp.gather(2, wide.tokens[:, :, None]).squeeze(2) * (wide.tokens != PAD_ID)
    torch.testing.assert_close(chosen.sum(1), wide.scores, atol=1e-4, rtol=1e-5)


def test_padded_regions_change_nothing(few):
    """Whatever a padded row holds, the valid regions' encoding, the logits, the attention and
    the decoded captions are the same: padded regions are no one's keys."""
    feats, mask, captions, vocab_size = few
    torch.manual_seed(3)
    model = tiny(vocab_size).eval()
    other = feats.clone()
    other[~mask] = 100 * torch.randn(int((~mask).sum()), feats.shape[2])
    with torch.no_grad():
        a, b = model.encode(feats, mask), model.encode(other, mask)
        fa, fb = model(a, captions), model(b, captions)
        ga, gb = greedy(model, a, 8), greedy(model, b, 8)
    valid = mask[:, None, :, None].expand_as(a["keys"])
    assert torch.equal(a["keys"][valid], b["keys"][valid])
    torch.testing.assert_close(fa.logits, fb.logits, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fa.alphas, fb.alphas, atol=1e-6, rtol=1e-6)
    assert torch.equal(ga.tokens, gb.tokens)


def test_config_is_checked():
    with pytest.raises(CapstackError, match=r"d_model: must be a multiple of heads \(3\), got 32"):
        make_decoder("transformer", {**TINY, "heads": 3}, 10, 4)
    with pytest.raises(CapstackError, match="unknown key 'hidden'"):
        make_decoder("transformer", {"hidden": 32}, 10, 4)


def test_an_xe_run_then_scst_train_it_on_region_features_with_box_geometry(tmp_path):
    """The loop end to end: XE, then SCST from its best checkpoint (CIDEr-D rewards, greedy
    baseline) on region stores with geometry appended (feature_dim = 16 + 5, padded regions)."""
    from trainer.checkpoint import load_checkpoint

    _, prepared = make_prepared(tmp_path, n_train=6, n_val=2, n_test=2)
    store = write_feature_store(tmp_path / "regions.lmdb", load_captions(prepared).image_ids,
                                kind="regions")
    build_cache(prepared, "train", tmp_path / "cider.npz")
    exp = tmp_path / "transformer.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "transformer", "decoder": {"name": "transformer", **TINY},
        "data": {"captions": str(prepared), "features": [str(store)], "seq_per_img": 2,
                 "box_geometry": True},
        "train": {"epochs": 1, "batch_size": 3, "lr": 5e-3, "log_every": 1},
        "eval": {"beam_size": 2}}))
    train(load_experiment(exp), tmp_path / "xe", progress=False)
    xe = load_checkpoint(tmp_path / "xe" / "best.pt")["model"]
    assert xe["feature_embed.0.weight"].shape == (32, 16 + 5)
    rl = ["objective.name=scst", f"train.init_from={tmp_path / 'xe' / 'best.pt'}",
          f"objective.reward={{name: cider-d, cache: {tmp_path / 'cider.npz'}}}",
          "objective.samples=3", "train.lr=1e-3"]
    train(load_experiment(exp, rl), tmp_path / "rl", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "train"]
    assert len(steps) == 2 and all({"reward", "baseline", "time_sample"} <= set(x) for x in steps)
    assert all(torch.isfinite(torch.tensor(x["loss"])) for x in steps)
    moved = load_checkpoint(tmp_path / "rl" / "last.pt")["model"]
    assert any(not torch.equal(moved[k], xe[k]) for k in xe)


def test_an_scst_loss_reaches_every_parameter(few):
    """REINFORCE through sampled words: the encoder, every decoder layer (through the cache) and
    the embeddings all get a gradient."""
    from trainer.decoding import sample
    from trainer.objectives.scst import generated_mask, scst_loss

    feats, mask, _, vocab_size = few
    torch.manual_seed(4)
    model = tiny(vocab_size)
    drawn = sample(model, model.encode(feats, mask), 6, n=2)
    advantage = torch.linspace(-1, 1, len(drawn.tokens))
    scst_loss(drawn.logprobs, generated_mask(drawn.tokens), advantage).backward()
    missing = [name for name, p in model.named_parameters()
               if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
