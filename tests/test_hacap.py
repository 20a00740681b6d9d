"""HACap: the SRU, the MANAGER's goals, the leaking discriminator and the adversarial objective."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.captions.prepared import load_captions
from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID
from trainer.config import load_experiment
from trainer.modules.sru import SRU, SRUCell
from trainer.objectives.adversarial import rank_rewards
from trainer.train import train
from trainer.training import loop
from trainer.training.build import build
from trainer.training.position import Position
from trainer_fixtures import (make_decoder, make_prepared, mean_xe, tiny_decoder_config,
                              write_experiment, write_feature_store)


def tiny_hacap(vocab_size=20, feature_dim=8, **values):
    torch.manual_seed(0)
    return make_decoder("hacap", {**tiny_decoder_config("hacap"), "dropout": 0.0, **values},
                        vocab_size, feature_dim)


def caption_rows(vocab_size=20, n=3, length=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(4, vocab_size, (n, length), generator=g)
    rows[:, 0] = BOS_ID
    rows[0, 4], rows[0, 5:] = EOS_ID, PAD_ID
    rows[1:, -1] = EOS_ID
    return rows


def images(n=3, locations=5, dim=8, seed=2):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, locations, dtype=torch.bool)
    mask[1, 3:] = False
    return torch.randn(n, locations, dim, generator=g), mask


# ---------------------------------------------------------------------------- the SRU

def test_sru_sequence_path_equals_the_step_path():
    torch.manual_seed(0)
    sru = SRU(6, 5, layers=3)
    u = torch.randn(4, 7, 6)
    parallel, last = sru(u)
    state = sru.initial(u, 4)
    for t in range(7):
        h, state = sru.step(u[:, t], state)
        assert torch.allclose(h, parallel[:, t], atol=1e-6)
    assert torch.allclose(state, last, atol=1e-6)


def test_sru_gates_limits():
    torch.manual_seed(0)
    cell = SRUCell(3, 4)
    u, c0 = torch.randn(2, 5, 3), torch.randn(2, 4)
    with torch.no_grad():
        cell.gates.bias[:4] = float("inf")  # forget gate 1: c never changes
        cell.gates.bias[4:] = float("-inf")  # reset gate 0: h is the highway term alone
    h, cells = cell(u, c0)
    assert torch.equal(cells, c0[:, None].expand(-1, 5, -1))
    highway = cell.transform(u)[..., 4:]
    assert torch.allclose(h, highway)


# ---------------------------------------------------------------------------- the decoder

@pytest.mark.parametrize("goal_space", ["features", "subgoal"])
def test_teacher_forced_logits_equal_the_step_by_step_ones(goal_space):
    model = tiny_hacap(goal_space=goal_space).eval()
    feats, mask = images()
    captions = caption_rows()
    ctx = model.encode(feats, mask)
    out = model(ctx, captions)
    state, logits = model.init_state(ctx, captions.shape[0]), []
    for t in range(captions.shape[1] - 1):
        step_logits, state, _ = model.step(captions[:, t], state, ctx)
        logits.append(step_logits)
    assert torch.allclose(torch.stack(logits, 1), out.logits, atol=1e-5)


def test_goals_have_unit_norm_and_the_leaked_feature_is_causal():
    model = tiny_hacap().eval()
    feats, mask = images()
    captions = caption_rows()
    out = model(model.encode(feats, mask), captions)
    assert torch.allclose(out.extras["goals"].norm(dim=2), torch.ones(3, 6), atol=1e-5)
    changed = captions.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 20  # word 4
    f, f_changed = (model.discriminator.features(c) for c in (captions, changed))
    assert torch.equal(f[:, :4], f_changed[:, :4]) and not torch.equal(f[:, 4], f_changed[:, 4])


def test_the_subgoal_reading_puts_the_goal_and_the_features_in_goal_size_numbers():
    """goal_space: subgoal (the paper's "subgoal vector g_t, with 6 dimensions" read as g itself):
    g has goal_size numbers, f is seen through a fixed orthonormal map, w_t = the summed g."""
    model = tiny_hacap(goal_space="subgoal").eval()
    feats, mask = images()
    out = model(model.encode(feats, mask), caption_rows())
    k = model.config.goal_size
    assert out.extras["goals"].shape[2] == k and out.extras["features"].shape[2] == k
    projection = model.feature_projection
    assert torch.allclose(projection @ projection.T, torch.eye(k), atol=1e-5)
    assert "feature_projection" not in dict(model.named_parameters())  # fixed: not trained
    window = torch.randn(2, k)
    assert torch.equal(model.subgoal(window), window)
    assert model.config.goal_space == "subgoal" and not hasattr(model, "goal_weights")


def test_the_discriminator_reads_text_only_and_scores_in_0_1():
    model = tiny_hacap().eval()
    captions = caption_rows()
    scores = torch.sigmoid(model.discriminator(captions))
    assert ((scores > 0) & (scores < 1)).all()
    features = []
    for seed in (2, 3):  # other images, the same words: the same leaked features
        feats, mask = images(seed=seed)
        ctx = model.encode(feats, mask)
        state = model.init_state(ctx, captions.shape[0])
        _, state, _ = model.step(captions[:, 0], state, ctx)
        features.append(state[3])
    assert torch.equal(features[0], features[1])


def test_attention_gets_no_gradient_to_the_worker():
    model = tiny_hacap()
    feats, mask = images()
    out = model(model.encode(feats, mask), caption_rows())
    (out.alphas[:, 1:] ** 2).sum().backward()  # after the first step (mean feature, uniform)
    worker = list(model.worker.parameters()) + list(model.word_embed.parameters())
    assert all(p.grad is None or not p.grad.any() for p in worker)
    assert model.attention.score.weight.grad.abs().sum() > 0


def test_the_worker_and_manager_learn_from_their_own_terms_and_d_from_neither():
    model = tiny_hacap()
    feats, mask = images()
    captions = caption_rows()
    targets = captions[:, 1:]
    out = model(model.encode(feats, mask), captions)
    mean_xe(out.logits, targets).backward(retain_graph=True)
    groups = model.parameter_groups()
    assert all(p.grad is None for p in groups["manager"])  # the WORKER reads goals detached
    assert any(p.grad is not None and p.grad.any() for p in groups["worker"])
    model.zero_grad(set_to_none=True)
    terms = model.loss_terms(out, targets, targets != 0, mask)
    terms.summed.backward()
    assert any(p.grad is not None and p.grad.any() for p in groups["manager"])
    assert all(p.grad is None for p in model.discriminator.parameters())
    assert {id(p) for p in model.discriminator.parameters()}.isdisjoint(
        id(p) for ps in groups.values() for p in ps)


def test_manager_term_is_minus_the_cosine_of_the_feature_direction():
    """The MANAGER's ML term equals -sum_t cos(f_{min(t+c, L)} - f_t, g_t) computed by hand."""
    model = tiny_hacap(doubly_stochastic=0.0, horizon=2).eval()
    feats, mask = images()
    captions = caption_rows()
    targets = captions[:, 1:]
    out = model(model.encode(feats, mask), captions)
    f, g = out.extras["features"], out.extras["goals"]
    expected = 0.0
    for n in range(3):
        last = int((targets[n] != 0).sum())
        for t in range(last):
            later = min(t + 2, last)
            expected -= torch.nn.functional.cosine_similarity(f[n, later] - f[n, t], g[n, t], dim=0)
    got = model.loss_terms(out, targets, targets != 0, mask).summed
    assert torch.allclose(got, expected, atol=1e-5)


def test_rank_rewards_lie_in_0_1_are_monotone_and_depend_on_ranks_only():
    rewards = torch.tensor([[0.3, 5.0], [0.1, -1.0], [0.9, 2.0], [0.5, 3.0]])
    scaled = rank_rewards(rewards, 16.0)
    assert ((scaled > 0) & (scaled < 1)).all()
    for column in range(2):
        order = rewards[:, column].argsort()
        assert (scaled[order, column].diff() > 0).all()
    assert torch.equal(rank_rewards(rewards * 10 + 3, 16.0), scaled)
    assert torch.equal(scaled[:, 0], scaled[:, 0].new_tensor(
        [torch.sigmoid(torch.tensor(16.0 * (r / 4 - 0.5))) for r in (2, 1, 4, 3)]))


# ---------------------------------------------------------------------------- training

# D's rounds at a size a test affords: one set of the split, one epoch, a few held-out images
SMALL_ROUNDS = {"sets": 1, "epochs": 1, "batch_size": 8, "lr": 1.0e-3, "heldout_images": 4}


@pytest.fixture(scope="module")
def ml_run(tmp_path_factory):
    """Maximum likelihood with D's rounds alongside (``interleaved_pretraining``), two epochs
    on tiny shapes data."""
    root = tmp_path_factory.mktemp("hacap")
    _, prepared = make_prepared(root)
    store = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    exp = write_experiment(root / "hacap.yaml", decoder="hacap", captions=prepared,
                           features=[store], epochs=2, log_every=1,
                           objective={"name": "interleaved_pretraining", "round_every": 0.5,
                                      "discriminator": SMALL_ROUNDS})
    train(load_experiment(exp), root / "ml", progress=False)
    return root, exp


ADVERSARIAL = ["objective.name=adversarial", "objective.ml_every=2", "objective.ml_batches=1",
               "objective.rollouts=2", "train.lr=1e-3",
               "objective.discriminator=" + json.dumps(SMALL_ROUNDS)]


def entries(run_dir, kind: str) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == kind]


def test_the_ml_phase_trains_d_in_rounds_and_logs_its_held_out_accuracy(ml_run):
    from trainer.checkpoint import load_checkpoint
    from trainer.decoders import build_decoder
    from trainer.config import load_experiment as load

    root, exp = ml_run
    trained = load_checkpoint(root / "ml" / "last.pt")
    config = load(exp)
    torch.manual_seed(config.train.seed)  # the run's initial weights
    initial = build_decoder("hacap", config.decoder.config, len(trained["vocab"]["itow"]),
                            trained["feature_dim"])
    d_now = {k[len("discriminator."):]: v for k, v in trained["model"].items()
             if k.startswith("discriminator.")}
    changed = [k for k, v in initial.discriminator.state_dict().items()
               if not torch.equal(v, d_now[k])]
    assert changed, "D's parameters did not move during maximum likelihood"
    rounds = entries(root / "ml", "discriminator")
    steps = [x["step"] for x in entries(root / "ml", "train")]
    # 3 batches an epoch, a round every 0.5 epoch (2 batches), the first after the first batch
    assert [x["step"] for x in rounds] == [s for s in steps if (s - 1) % 2 == 0]
    assert [x["round"] for x in rounds] == list(range(1, len(rounds) + 1))
    assert all(x["phase"] == "pretraining" and 0 <= x["heldout_accuracy"] <= 1 for x in rounds)
    assert trained["objective"]["extra"]["rounds"] == len(rounds)


def test_the_ml_phase_resumes_exactly_across_ds_rounds(ml_run, tmp_path):
    """Killed after epoch 1 and resumed: the same losses, D rounds and held-out scores."""
    _, exp = ml_run
    train(load_experiment(exp, ["train.epochs=1"]), tmp_path / "split", progress=False)
    resumed = train(load_experiment(exp), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (1, 0)
    train(load_experiment(exp), tmp_path / "whole", progress=False)
    untimed = lambda rows: [{k: v for k, v in x.items() if not k.startswith("time")}  # noqa: E731
                            for x in rows]
    for kind in ("train", "discriminator"):
        assert untimed(entries(tmp_path / "split", kind)) == untimed(
            entries(tmp_path / "whole", kind)), kind


def test_an_adversarial_step_raises_ds_score_of_the_generators_samples(ml_run, tmp_path):
    from trainer.checkpoint import load_checkpoint
    from trainer.decoding import sample
    from trainer.objectives.adversarial import with_bos

    root, exp = ml_run
    config = load_experiment(exp, ADVERSARIAL + [f"train.init_from={root / 'ml'}",
                                                 "objective.ml_every=100", "train.lr=5e-2"])
    run = build(config, tmp_path / "adv")
    run.model.load_state_dict(load_checkpoint(root / "ml" / "best.pt")["model"])
    run.objective.rounds.run = lambda *args: {}  # the generator moves, D stays
    batch = next(iter(run.batches.epoch(0))).to(run.device)

    def score_of_samples():
        torch.manual_seed(5)
        run.model.eval()
        with torch.no_grad():
            drawn = sample(run.model, run.model.encode(batch.feats, batch.mask), 8, n=8)
            return torch.sigmoid(run.model.discriminator(with_bos(drawn.tokens))).mean().item()

    before = score_of_samples()
    d_before = {k: v.clone() for k, v in run.model.discriminator.state_dict().items()}
    for _ in range(5):
        run.model.train()
        stats = loop.train_step(run, Position.fresh("cider"), batch)
        assert "intrinsic" in stats  # adversarial steps
    after = score_of_samples()
    assert all(torch.equal(v, run.model.discriminator.state_dict()[k]) for k, v in d_before.items())
    assert after > before, (before, after)


def test_adversarial_phases_follow_their_schedule_and_resume_exactly(ml_run, tmp_path):
    root, exp = ml_run
    overrides = ADVERSARIAL + [f"train.init_from={root / 'ml'}", "train.epochs=2",
                               "train.log_every=1"]
    train(load_experiment(exp, overrides), tmp_path / "whole", progress=False)
    train(load_experiment(exp, overrides + ["train.epochs=1"]), tmp_path / "split", progress=False)
    resumed = train(load_experiment(exp, overrides), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (1, 0)
    whole, split = entries(tmp_path / "whole", "train"), entries(tmp_path / "split", "train")
    assert [x["loss"] for x in split] == [x["loss"] for x in whole]
    assert [x.get("d_loss") for x in split] == [x.get("d_loss") for x in whole]
    strip = lambda rows: [{k: v for k, v in x.items() if not k.startswith("time")}  # noqa: E731
                          for x in rows]
    assert strip(entries(tmp_path / "split", "discriminator")) == strip(
        entries(tmp_path / "whole", "discriminator"))
    kinds = ["adv" if "intrinsic" in x else "ml" for x in whole]
    # 2 adversarial batches (a D round after each), then 1 ML batch, and again
    assert kinds[:6] == ["adv", "adv", "ml", "adv", "adv", "ml"], kinds
    assert ["d_loss" in x for x in whole[:3]] == [True, True, False]
    assert all(x["phase"] == "adversarial" for x in entries(tmp_path / "whole", "discriminator"))


def test_evaluation_draws_the_managers_goals_along_each_caption(ml_run, tmp_path):
    from trainer.evaluation.evaluate import evaluate_checkpoint

    root, _ = ml_run
    metrics = evaluate_checkpoint(root / "ml" / "best.pt", tmp_path / "eval", figures=2,
                                  spice=False, beam_size=2)
    assert metrics["training"] == "XE" and metrics["approach"] == "hacap"
    # how varied the captions are (adversarial training's aim), in metrics.json beside the scores
    written = json.loads((tmp_path / "eval" / "metrics.json").read_text())["diversity"]
    assert written == metrics["diversity"] and written["captions"] == metrics["images"]
    assert {"distinct-1", "distinct-2", "vocab_used", "unique_captions",
            "mean_length"} <= set(written)
    assert 0 < written["unique_captions"] <= 1 and isinstance(written["vocab_used"], int)
    pictures = sorted((tmp_path / "eval" / "goals").glob("*.png"))
    assert len(pictures) == 2 and all(p.stat().st_size > 5000 for p in pictures)


def test_goal_trace_follows_the_decoded_caption():
    model = tiny_hacap().eval()
    feats, mask = images()
    tokens = caption_rows()[:, 1:]
    trace = model.goal_trace(model.encode(feats, mask), tokens)
    assert trace["subgoals"].shape == (3, 6, 6) and trace["cosines"].shape == (3, 6)
    assert (trace["cosines"][0, 4:] == 0).all()  # after the first caption's <eos>
    assert trace["cosines"].abs().max() <= 1 + 1e-6
