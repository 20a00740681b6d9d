"""HACap's discriminator rounds (LeakGAN's D schedule) and the adversarial phase's one policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.captions.prepared import load_captions
from trainer.config import load_experiment
from trainer.decoding import sample
from trainer.objectives.discriminator_rounds import (DiscriminatorSchedule, discrimination,
                                                     dropout_off, global_token_rows, with_bos)
from trainer.objectives.interleaved_pretraining import batches_between
from trainer.training.build import build
from trainer_fixtures import make_prepared, write_experiment, write_feature_store


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Tiny shapes data (24 train images, 8 validation ones) and a HACap experiment on it."""
    root = tmp_path_factory.mktemp("rounds")
    _, prepared = make_prepared(root, n_train=24, n_val=8)
    store = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    exp = write_experiment(root / "hacap.yaml", decoder="hacap", captions=prepared,
                           features=[store], objective={"name": "interleaved_pretraining"})
    return root, exp


def test_the_schedules_defaults_are_leakgans():
    """Image COCO/Main.py: 5 sets of fresh samples, 3 D epochs each, the whole real set's
    size, batches of 64; Discriminator.py: Adam 5e-5."""
    s = DiscriminatorSchedule()
    assert (s.sets, s.epochs, s.images, s.batch_size, s.lr) == (5, 3, 0, 64, 5.0e-5)
    assert batches_between(0.6, 100) == 60 and batches_between(0.6, 1) == 1


def test_ds_held_out_accuracy_rises_above_chance_within_a_few_rounds(toy, tmp_path):
    """A regression test of the schedule: an untrained generator's samples against the shapes'
    references, D scored on validation images it never trained on."""
    root, exp = toy
    config = load_experiment(exp, ["objective.discriminator.sets=2",
                                   "objective.discriminator.epochs=2",
                                   "objective.discriminator.batch_size=16",
                                   "objective.discriminator.lr=3e-3",
                                   "objective.discriminator.heldout_images=8"])
    (tmp_path / "run").mkdir()
    run = build(config, tmp_path / "run")
    batch = next(iter(run.batches.epoch(0))).to(run.device)
    rounds = run.objective.rounds
    first = rounds.heldout_scores(run.model, seed=0)["heldout_accuracy"]
    accuracies = [rounds.run(run.model, 0, "pretraining", batch)["d_heldout_accuracy"]
                  for _ in range(3)]
    assert rounds.rounds == 3
    assert accuracies[-1] >= 0.8 and accuracies[-1] > first, (first, accuracies)


def test_a_round_trains_d_only_and_draws_the_same_sets_again_from_the_same_state(toy, tmp_path):
    root, exp = toy
    config = load_experiment(exp, ["objective.discriminator.sets=1",
                                   "objective.discriminator.epochs=1",
                                   "objective.discriminator.heldout_images=4"])
    (tmp_path / "run").mkdir()
    run = build(config, tmp_path / "run")
    batch = next(iter(run.batches.epoch(0))).to(run.device)
    generator = {k: v.clone() for k, v in run.model.state_dict().items()
                 if not k.startswith("discriminator.")}
    start = {k: v.clone() for k, v in run.model.state_dict().items()}
    optimiser = run.objective.rounds.optimizer
    optimiser_start = optimiser.state_dict()
    once = run.objective.rounds.run(run.model, 0, "pretraining", batch)
    after_once = {k: v.clone() for k, v in run.model.state_dict().items()}
    assert all(torch.equal(v, after_once[k]) for k, v in generator.items())
    assert any(not torch.equal(v, after_once[k]) for k, v in start.items())
    # the same round again from the same state: the same draws, the same D
    run.model.load_state_dict(start)
    run.objective.rounds.rounds = 0
    fresh = torch.optim.Adam(run.model.discriminator.parameters(), lr=config.objective.config
                             .discriminator.lr)
    fresh.load_state_dict(optimiser_start)
    run.objective.rounds.optimizer = fresh
    again = run.objective.rounds.run(run.model, 0, "pretraining", batch)
    assert again["d_loss"] == once["d_loss"]
    assert all(torch.equal(v, after_once[k]) for k, v in run.model.state_dict().items())


def test_a_rounds_rows_are_the_global_batchs_on_every_rank():
    """Two ranks' parts of a set, each placed at its images' rows, add up to the whole set."""
    from trainer.batch import Share

    whole = torch.arange(1, 25).view(6, 4)  # 3 images, 2 rows each
    parts = [whole[:2], whole[2:]]  # rank 0: image 0; rank 1: images 1 and 2
    placed = [global_token_rows(part, Share(0, 6, 3, first=first), 2, 4)
              for part, first in zip(parts, (0, 1))]
    assert torch.equal(placed[0] + placed[1], whole)


def test_discrimination_counts_right_calls_on_both_sides():
    class Fixed(torch.nn.Module):  # scores a row by its first word: 5 is real
        def forward(self, tokens):
            return torch.where(tokens[:, 1] == 5, 3.0, -3.0)

    real = with_bos(torch.tensor([[5, 2], [5, 2], [6, 2]]))
    fake = with_bos(torch.tensor([[6, 2], [5, 2], [6, 2]]))
    scores = discrimination(Fixed(), real, fake)
    assert scores["heldout_accuracy"] == pytest.approx(4 / 6)
    assert scores["heldout_real"] > 0.5 > scores["heldout_fake"]


# ---------------------------------------------------------------------------- one policy

def test_the_adversarial_loss_scores_the_policy_that_sampled(toy, tmp_path):
    """Dropout is off for sampling and for the pass that recomputes log p: the log p the
    sampler saw is the one reinforced, and the loss is a function of the step key alone, not
    of fresh dropout masks (seeded comparison)."""
    from trainer.objectives.base import StepKey

    root, exp = toy
    config = load_experiment(exp, ["objective.name=adversarial", "objective.rollouts=2",
                                   "decoder.dropout=0.5"])
    (tmp_path / "adv").mkdir()
    run = build(config, tmp_path / "adv")
    run.model.train()
    batch = next(iter(run.batches.epoch(0))).to(run.device)
    key = StepKey(0, 0, 0)
    losses = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        loss, _ = run.objective.loss(run.model, batch, key)
        losses.append(loss.item())
    assert losses[0] == losses[1]
    assert run.model.training  # the run's mode is given back
    # the sampler's log p equals the teacher-forced one the WORKER's loss reinforces
    with dropout_off(run.model), torch.no_grad():
        ctx = run.model.encode(batch.feats, batch.mask)
        drawn = sample(run.model, ctx, 8, noise=key.sampling_noise(batch.share, 1))
        out = run.model(ctx, with_bos(drawn.tokens))
    forced = torch.log_softmax(out.logits, 2).gather(2, drawn.tokens[:, :, None]).squeeze(2)
    live = drawn.tokens != 0
    assert torch.allclose(forced[live], drawn.logprobs[live], atol=1e-5)
    # with dropout on (train mode) two passes differ: what the policy choice rules out
    torch.manual_seed(1)
    a = run.model(ctx, with_bos(drawn.tokens)).logits
    b = run.model(ctx, with_bos(drawn.tokens)).logits
    assert not torch.allclose(a, b)


def test_the_mean_baseline_centres_the_rewards_on_the_batchs_generated_words():
    from trainer.batch import Share
    from trainer.objectives.adversarial import minus_mean

    rewards = torch.tensor([[0.5, 0.3, 0.9], [0.2, 0.4, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    centred = minus_mean(rewards, mask, Share(0, 2, 2), mask.sum().float())
    assert torch.isclose((centred * mask).sum(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(rewards - centred, torch.full_like(rewards, 1.4 / 5))


def test_a_sets_references_keep_their_end_when_samples_are_shorter(toy, tmp_path):
    """train.max_len below the prepared captions' length: the references are not cut (their
    <eos> kept), the rows are as wide as the longer of the two."""
    from pipeline.core.tokens import EOS_ID

    root, exp = toy
    config = load_experiment(exp, ["train.max_len=3", "objective.discriminator.images=4"])
    (tmp_path / "run").mkdir()
    run = build(config, tmp_path / "run")
    train = run.objective.setting.batches("train")
    rows = train.rows[:4]
    drawn = run.objective.rounds.caption_set(run.model, train, rows, np.random.default_rng(0), (0,))
    real, fake = drawn.real, drawn.fake
    assert real.shape[1] == fake.shape[1] == train.all_captions.shape[1] > 3 + 2
    assert ((real == EOS_ID).sum(1) == 1).all() and ((fake == EOS_ID).sum(1) <= 1).all()
