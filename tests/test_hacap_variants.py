"""HACap's two variants: LeakGAN's released code's credit assignment (``objective.credit:
leakgan_code``) and a discriminator that also reads the image (``decoder.
discriminator_reads_image``); and the per-step logit scale of ``decode.sample`` under the first."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID
from pipeline.core.errors import CapstackError
from trainer.batch import TrainBatch, whole_batch
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.config import experiment_from_dict, load_experiment
from trainer.decoding import SamplingNoise, sample
from trainer.objectives.adversarial import (Adversarial, AdversarialConfig,
                                            code_generation_scale, code_negatives_scale,
                                            position_rewards, to_global_width)
from trainer.objectives.base import Setting, StepKey
from trainer.objectives.discriminator_rounds import (CaptionSet, dropout_off, global_image_rows,
                                                     with_bos)
from trainer.objectives.scst import drawn_mask, generated_mask
from trainer.rewards.intrinsic import intrinsic_rewards
from trainer.train import train
from trainer.training import loop
from trainer.training.build import build
from trainer.training.position import Position
from test_hacap import caption_rows  # token rows of VOCAB (20) words, <bos> first
from trainer_fixtures import (make_decoder, tiny_decoder_config, write_experiment)

VOCAB, FEATURE_DIM = 20, 8


def tiny_hacap(**values):
    torch.manual_seed(0)
    return make_decoder("hacap", {**tiny_decoder_config("hacap"), "dropout": 0.0, **values},
                        VOCAB, FEATURE_DIM)


def images(n=3, locations=5, seed=2):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, locations, dtype=torch.bool)
    mask[1, 3:] = False
    return torch.randn(n, locations, FEATURE_DIM, generator=g), mask


# ---------------------------------------------------------------------------- Q by position

def test_position_rewards_are_the_codes_sigmoid_of_the_rows_place_divided_by_rollouts():
    rewards = torch.tensor([[0.3, 5.0], [0.1, -1.0], [0.9, 2.0], [0.5, 3.0]])
    q = position_rewards(rewards, 16.0, 4)
    by_hand = [1 / (1 + np.exp(-(16 * i / 4 - 8))) / 4 for i in (1, 2, 3, 4)]
    for column in range(2):
        assert q[:, column].tolist() == pytest.approx(by_hand, rel=1e-6)
    # nothing of the values: any order of them, or other values, gives the same Q
    assert torch.equal(position_rewards(rewards[torch.tensor([2, 0, 3, 1])], 16.0, 4), q)
    assert torch.equal(position_rewards(-rewards * 7 + 1, 16.0, 4), q)
    assert torch.equal(position_rewards(torch.zeros(4, 2), 16.0, 4), q)  # ties: a value each
    assert ((q > 0) & (q <= 0.25)).all()


def test_position_rewards_batch_mean_is_the_constant_leakgans_issue_17_reports():
    """64 rows, 4 rollouts (the Synthetic code): the batch mean never moves, 0.12695..."""
    q = position_rewards(torch.randn(64, 8), 16.0, 4)
    assert float(q.mean()) == pytest.approx(0.12695181503855285, rel=1e-6)


# ---------------------------------------------------------------------------- sampling scale

def hand_sampled(model, ctx, max_len, scale, noise, rows):
    """Words drawn step by step by inverting the cdf of softmax(scale(t) x logits) at the
    noise's uniforms, and the unscaled model's log p of each (numpy, float64)."""
    state = model.init_state(ctx, rows)
    words = torch.full((rows,), BOS_ID, dtype=torch.long)
    done = np.zeros(rows, bool)
    tokens, logps = [], []
    for t in range(max_len + 1):
        logits, state, _ = model.step(words, state, ctx)
        logits = logits.double().numpy()
        u = noise(t, rows)
        picked = np.empty(rows, np.int64)
        for r in range(rows):
            if t == max_len:
                picked[r] = EOS_ID
                continue
            scaled = np.exp(scale(t) * (logits[r] - logits[r].max()))
            cdf = np.cumsum(scaled / scaled.sum())
            picked[r] = min(int(np.searchsorted(cdf, u[r] * cdf[-1], side="right")), VOCAB - 1)
        picked[done] = PAD_ID
        logp = logits - logits.max(1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
        logps.append(np.where(done, 0.0, logp[np.arange(rows), picked]))
        tokens.append(picked)
        done = done | (picked == EOS_ID)
        words = torch.as_tensor(picked)
        if done.all():
            break
    return np.stack(tokens, 1), np.stack(logps, 1)


def test_a_scale_of_one_draws_what_sampling_without_a_scale_draws():
    model = tiny_hacap().eval()
    feats, mask = images()
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        for temperature in (1.0, 0.7):
            noise = SamplingNoise((3,), 12)
            plain = sample(model, ctx, 6, temperature, n=4, noise=noise)
            scaled = sample(model, ctx, 6, temperature, n=4, noise=noise, scale=lambda t: 1.0)
            assert torch.equal(plain.tokens, scaled.tokens)
            assert torch.equal(plain.logprobs, scaled.logprobs)


def test_a_scaled_draw_inverts_the_cdf_of_the_scaled_softmax_and_records_the_models_log_p():
    model = tiny_hacap().eval()
    feats, mask = images()
    noise = SamplingNoise((4,), 12)
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        drawn = sample(model, ctx, 6, n=4, noise=noise, scale=code_generation_scale)
        unscaled = sample(model, ctx, 6, n=4, noise=noise)
        tokens, logps = hand_sampled(model, ctx, 6, code_generation_scale, noise, 12)
    assert drawn.tokens.tolist() == tokens.tolist()
    assert drawn.logprobs.double().numpy() == pytest.approx(logps, abs=1e-5)
    assert not torch.equal(drawn.tokens, unscaled.tokens)  # the scale changed some draws
    assert code_generation_scale(0) == code_generation_scale(1) == 1.5
    assert code_generation_scale(2) == code_generation_scale(9) == 0.8


# ---------------------------------------------------------------------------- credit: the code's

def objective(**values) -> Adversarial:
    return Adversarial(AdversarialConfig(rollouts=2, **values), Setting(None, max_len=6))


def image_batch() -> TrainBatch:
    """Three images, a caption each (what an adversarial step reads of it: the images)."""
    feats, mask = images()
    captions = caption_rows()
    share = whole_batch(int((captions[:, 1:] != PAD_ID).sum()), 3, 3)
    return TrainBatch([0, 1, 2], feats, mask, captions, share)


def test_the_codes_credit_is_the_batch_means_product_worker_and_manager():
    """loss = -mean(Q) mean(cos) - mean(r^I) sum log p(drawn) / words, computed by hand on the
    samples drawn with the code's scale; the WORKER's gradient is mean(r^I) times the gradient
    of the mean log p of its own samples."""
    model = tiny_hacap()
    batch = image_batch()
    key = StepKey(0, 0, 0)
    adversarial = objective(credit="leakgan_code")
    adversarial.bind(model)
    loss, stats = adversarial.loss(model, batch, key)
    loss.backward()
    groups = model.parameter_groups()
    worker_grads = [p.grad.clone() for p in groups["worker"] if p.grad is not None]
    assert worker_grads and any(g.any() for g in worker_grads)
    model.zero_grad(set_to_none=True)

    horizon = model.config.horizon
    with dropout_off(model):
        ctx = model.encode(batch.feats, batch.mask)
        with torch.no_grad():
            tokens = sample(model, ctx, 6, noise=key.sampling_noise(batch.share, 1),
                            scale=code_generation_scale).tokens
        out = model(ctx, with_bos(tokens))
    f, g = out.extras["features"], out.extras["goals"]
    mask, drawn = generated_mask(tokens), drawn_mask(tokens, 6)
    words = mask.sum()
    last = mask.sum(1)
    cosines = []
    for n in range(len(tokens)):
        for t in range(int(last[n])):
            later = min(t + horizon, int(last[n]))
            cosines.append(F.cosine_similarity(f[n, later] - f[n, t], g[n, t], dim=0))
    mean_cos = torch.stack(cosines).mean()
    # 3 rows of the global batch (3 images, a sample each), 2 rollouts: every segment's Q
    mean_q = float(np.mean([1 / (1 + np.exp(-16 * (i / 3 - 0.5))) for i in (1, 2, 3)])) / 2
    intrinsic = intrinsic_rewards(f, g, horizon, last).detach()
    mean_intrinsic = (intrinsic * mask).sum() / words
    logp = torch.log_softmax(out.logits, 2).gather(2, tokens[:, :, None]).squeeze(2)
    mean_logp = (logp * drawn).sum() / words
    expected = -mean_q * mean_cos - mean_intrinsic * mean_logp
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert stats["intrinsic"] == pytest.approx(float(mean_intrinsic), abs=1e-6)
    mean_logp.backward()
    by_hand = [-mean_intrinsic * p.grad for p in groups["worker"] if p.grad is not None]
    assert len(by_hand) == len(worker_grads)
    for got, want in zip(worker_grads, by_hand):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)


def test_the_codes_credit_refuses_a_baseline_naming_both_keys(tmp_path):
    with pytest.raises(ValueError, match="baseline.*credit 'leakgan_code'.*objective.credit"):
        objective(credit="leakgan_code", baseline="mean")
    objective(credit="paper", baseline="mean")  # the paper's credit takes one
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps({
        "name": "exp", "decoder": {"name": "hacap"},
        "objective": {"name": "adversarial", "credit": "leakgan_code", "baseline": "mean"},
        "data": {"captions": "prepared", "features": ["grid.lmdb"]}}))
    with pytest.raises(CapstackError, match=r"exp.yaml: objective.baseline: must be 'none' with "
                                            r"credit 'leakgan_code'"):
        load_experiment(path)


def test_the_codes_credit_draws_ds_negatives_sharper_and_the_papers_unscaled():
    model = tiny_hacap()
    code, paper = objective(credit="leakgan_code"), objective()
    code.bind(model)
    paper.bind(model)
    assert code.rounds.scale is not None and paper.rounds.scale is None
    assert [code.rounds.scale(t) for t in range(4)] == [1.5] * 4


# ---------------------------------------------------------------------------- D reads the image

def test_a_d_that_reads_the_image_scores_by_it_and_leaks_the_texts_features_alone():
    model = tiny_hacap(discriminator_reads_image=True).eval()
    text_only = tiny_hacap().eval()
    d = model.discriminator
    captions = caption_rows()
    feats, mask = images()
    other, other_mask = images(seed=5)
    pooled = model.encode(feats, mask)["mean"]
    scores = d(captions, pooled)
    assert not torch.allclose(scores, d(captions, model.encode(other, other_mask)["mean"]))
    assert torch.equal(scores, d(captions, pooled))
    with pytest.raises(ValueError, match="reads the image"):
        d(captions)
    # every weight but D's score is the text-only decoder's: D's features (what leaks) are
    # the text-only D's, and decoding reads the same, whatever the image
    shared = {k: v for k, v in text_only.state_dict().items()
              if not k.startswith("discriminator.classify")}
    missing, unexpected = model.load_state_dict(shared, strict=False)
    assert sorted(missing) == ["discriminator.classify.bias", "discriminator.classify.weight",
                               "discriminator.image.bias", "discriminator.image.weight"]
    assert not unexpected
    assert torch.equal(d.features(captions), text_only.discriminator.features(captions))
    for ctx_feats, ctx_mask in ((feats, mask), (other, other_mask)):
        ctx = model.encode(ctx_feats, ctx_mask)
        assert torch.equal(model(ctx, captions).logits, text_only(ctx, captions).logits)
    # a text-only D has no image weights, and reads no image
    assert not text_only.discriminator.reads_image
    assert not any(k.startswith("discriminator.image") for k in text_only.state_dict())
    assert torch.equal(text_only.discriminator(captions),
                       text_only.discriminator(captions, pooled))


def test_a_caption_set_gives_each_row_its_images_pooled_feature():
    real = torch.arange(12).view(6, 2)
    pooled = torch.tensor([[1.0], [2.0], [3.0]])
    drawn = CaptionSet(real, real + 100, pooled, per_image=2)
    assert drawn.images_of(torch.tensor([0, 1, 2, 5])).squeeze(1).tolist() == [1, 1, 2, 3]
    assert CaptionSet(real, real).images_of(torch.tensor([0])) is None


def test_a_sets_pooled_images_are_the_global_batchs_on_every_rank():
    """Two ranks' images, each placed at its rows, add up to the whole set's."""
    from trainer.batch import Share

    whole = torch.arange(1.0, 13.0).view(3, 4)  # 3 images' pooled features
    placed = [global_image_rows(part, Share(0, 6, 3, first=first))
              for part, first in ((whole[:1], 0), (whole[1:], 1))]
    assert torch.equal(placed[0] + placed[1], whole)
    padding = global_image_rows(whole[:1], Share(0, 6, 3, first=0, weight=0.0))
    assert not padding.any()  # a rank that only pads a batch gives nothing


def test_samples_are_padded_to_the_widest_ranks_so_qs_rows_add_up_over_ranks():
    """Sampling stops when a rank's rows have ended: two ranks' samples 6 and 11 wide both
    become 11 wide (the rollouts' segments, Q's columns, then agree); one process keeps its own."""
    from trainer.batch import Share

    max_len = 16
    narrow, wide = torch.full((2, 6), 5), torch.full((2, 11), 5)
    one_hot = lambda t: F.one_hot(torch.tensor(t.shape[1]), max_len + 2).float()  # noqa: E731
    for mine, other in ((narrow, wide), (wide, narrow)):
        share = Share(0, 4, 4, total=lambda x, other=other: x + one_hot(other))
        padded = to_global_width(mine, share, max_len)
        assert padded.shape == (2, 11)
        assert torch.equal(padded[:, :mine.shape[1]], mine) and (padded[:, mine.shape[1]:]
                                                                  == PAD_ID).all()
    assert torch.equal(to_global_width(narrow, whole_batch(0, 2, 2), max_len), narrow)


# ---------------------------------------------------------------------------- runs

SMALL_ROUNDS = {"sets": 1, "epochs": 1, "batch_size": 8, "lr": 1.0e-3, "heldout_images": 4}
ADVERSARIAL = ["objective.name=adversarial", "objective.ml_every=2", "objective.ml_batches=1",
               "objective.rollouts=2", "train.lr=1e-3",
               "objective.discriminator=" + json.dumps(SMALL_ROUNDS)]


def experiment(root, prepared, store, name, epochs=1, **decoder):
    exp = write_experiment(root / f"{name}.yaml", decoder="hacap", captions=prepared,
                           features=[store], epochs=epochs, log_every=1,
                           objective={"name": "interleaved_pretraining", "round_every": 0.5,
                                      "discriminator": SMALL_ROUNDS})
    config = yaml.safe_load(exp.read_text())
    config["decoder"].update(decoder)
    exp.write_text(yaml.safe_dump(config, sort_keys=False))
    return exp


def entries(run_dir, kind: str) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == kind]


def test_an_old_checkpoint_loads_and_the_codes_credit_trains_from_it(data, tmp_path):
    """An ML checkpoint saved before ``discriminator_reads_image`` existed (the key taken out
    of its experiment and identity) loads, and an adversarial run with the code's credit
    starts from it: its steps, D's rounds and interludes."""
    _, prepared, store, _ = data
    exp = experiment(tmp_path, prepared, store, "ml")
    train(load_experiment(exp), tmp_path / "ml", progress=False)
    payload = load_checkpoint(tmp_path / "ml" / "best.pt")
    for holder in (payload["experiment"]["decoder"], payload["identity"]["decoder"]):
        del holder["discriminator_reads_image"]
    payload.pop("path")
    save_checkpoint(tmp_path / "old.pt", payload)
    old = load_checkpoint(tmp_path / "old.pt")
    assert not experiment_from_dict(old["experiment"], "old").decoder.config \
        .discriminator_reads_image  # read as its default
    assert not any(k.startswith("discriminator.image") for k in old["model"])
    assert old["model"]["discriminator.classify.weight"].shape == (1, 16)

    overrides = ADVERSARIAL + [f"train.init_from={tmp_path / 'old.pt'}",
                               "objective.credit=leakgan_code"]
    train(load_experiment(exp, overrides), tmp_path / "adv", progress=False)
    steps = entries(tmp_path / "adv", "train")
    kinds = ["adv" if "intrinsic" in x else "ml" for x in steps]
    assert kinds[:3] == ["adv", "adv", "ml"], kinds
    assert all(np.isfinite(x["loss"]) for x in steps)
    rounds = entries(tmp_path / "adv", "discriminator")
    assert len(rounds) == kinds.count("adv")
    assert all(0 <= r["heldout_accuracy"] <= 1 for r in rounds)
    saved = load_checkpoint(tmp_path / "adv" / "last.pt")
    assert saved["experiment"]["objective"]["credit"] == "leakgan_code"


def test_a_d_that_reads_the_image_trains_in_rounds_and_scores_rollouts(data, tmp_path):
    """With ``discriminator_reads_image``: a D round trains W_img on sets that carry each
    image's pooled feature, and an adversarial step scores its rollouts with the image."""
    _, prepared, store, _ = data
    exp = experiment(tmp_path, prepared, store, "image", discriminator_reads_image=True)
    config = load_experiment(exp)
    (tmp_path / "run").mkdir()
    run = build(config, tmp_path / "run")
    rounds = run.objective.rounds
    train_split = run.objective.setting.batches("train")
    drawn = rounds.caption_set(run.model, train_split, train_split.rows[:4],
                               np.random.default_rng(0), (0,))
    assert drawn.images is not None and drawn.images.shape == (4, 16)
    assert len(drawn.real) == len(drawn.fake) == 4 * drawn.per_image
    rounds.scale = code_negatives_scale  # the code's credit's D draws from sharper logits
    sharper = rounds.caption_set(run.model, train_split, train_split.rows[:4],
                                 np.random.default_rng(0), (0,))
    rounds.scale = None
    assert torch.equal(sharper.real, drawn.real) and torch.equal(sharper.images, drawn.images)
    assert not torch.equal(sharper.fake, drawn.fake)
    batch = next(iter(run.batches.epoch(0))).to(run.device)
    image_before = run.model.discriminator.image.weight.clone()
    stats = rounds.run(run.model, 0, "pretraining", batch)
    assert np.isfinite(stats["d_loss"]) and 0 <= stats["d_heldout_accuracy"] <= 1
    assert not torch.equal(image_before, run.model.discriminator.image.weight)

    adversarial = load_experiment(exp, ADVERSARIAL + ["objective.ml_every=100"])
    (tmp_path / "adv").mkdir()
    adv = build(adversarial, tmp_path / "adv")
    adv.model.load_state_dict(run.model.state_dict())
    before = {k: v.clone() for k, v in adv.model.state_dict().items()
              if not k.startswith("discriminator.")}
    adv.model.train()
    step = loop.train_step(adv, Position.fresh("cider"), batch)
    assert "intrinsic" in step and np.isfinite(step["loss"]) and "d_loss" in step
    assert any(not torch.equal(v, adv.model.state_dict()[k]) for k, v in before.items())
